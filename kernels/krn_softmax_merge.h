/*
 * krn_softmax_merge.h — the online-softmax arithmetic of the attention kernels (FlashAttention's
 * recurrence), as inline functions compiled both by the host C compiler and by nvcc for the
 * device, so the CPU unit tests run the exact code the kernels run.
 *
 * A row's running state over the scores s_j seen so far is
 *   m = max_j s_j          (-inf before any score)
 *   l = sum_j exp(s_j - m)
 *   o = sum_j exp(s_j - m) * v_j          (a vector, unnormalized)
 * and the attention output is o / l. A tile of new scores updates it with
 *   m' = max(m, max_tile s);  c = exp(m - m');  l' = c * l + sum_tile exp(s - m');  o' = c * o +
 * ... and two partial states over disjoint key ranges (split-K) merge into the state over their
 * union the same way: m = max(m_a, m_b), each side scaled by exp(m_x - m). Merging is
 * commutative and, up to rounding, associative, so splits may be merged in any order.
 *
 * Masked scores are -inf. Every function is safe when a state or a tile saw nothing (m = -inf):
 * no NaN is ever produced from -inf - -inf.
 */
#ifndef KRN_SOFTMAX_MERGE_H
#define KRN_SOFTMAX_MERGE_H

#ifdef __CUDACC__
#define KRN_HD __host__ __device__ __forceinline__
#else
#include <math.h>
#define KRN_HD static inline
#endif

/* The new running maximum after a tile whose largest score is tile_max. */
KRN_HD float krn_sm_max(float m, float tile_max)
{
    return m > tile_max ? m : tile_max;
}

/* The factor that rescales a state kept at maximum m_old to the new maximum m_new (>= m_old):
 * exp(m_old - m_new), 0 when the state saw nothing, 1 when neither saw anything. */
KRN_HD float krn_sm_scale(float m_old, float m_new)
{
    if (m_new == -INFINITY)
        return 1.0f;
    if (m_old == -INFINITY)
        return 0.0f;
    return expf(m_old - m_new);
}

/* The weight exp(s - m) of a score at running maximum m; 0 for a masked score (s = -inf). */
KRN_HD float krn_sm_prob(float s, float m)
{
    if (s == -INFINITY)
        return 0.0f;
    return expf(s - m);
}

/* Merges the partial state (m_b, l_b) into (*m, *l), both over disjoint key ranges. Writes the
 * factors the o vectors take: o = *scale_a * o_a + *scale_b * o_b. */
KRN_HD void krn_sm_merge(float *m, float *l, float m_b, float l_b, float *scale_a, float *scale_b)
{
    float mn = krn_sm_max(*m, m_b);
    float sa = krn_sm_scale(*m, mn), sb = krn_sm_scale(m_b, mn);
    *l = *l * sa + l_b * sb;
    *m = mn;
    *scale_a = sa;
    *scale_b = sb;
}

/* The factor that turns o into the output: 1 / l, or 0 when the row saw no key (l = 0), so a
 * row with nothing to attend to yields zeros instead of NaN. */
KRN_HD float krn_sm_inv(float l)
{
    return l > 0.0f ? 1.0f / l : 0.0f;
}

#endif
