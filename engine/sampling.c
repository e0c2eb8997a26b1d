/*
 * sampling.c — the sampler described in sampling.h: exact kept sets by partial selection, one
 * PRNG draw per sampled token.
 *
 * Every weight is eng_vexp() (vexp.h), never libm's exp(): the same bits on every machine.
 *
 * Invariant of the working arrays after prepare(), in one of two layouts:
 *   dense   (no top_k cut: plain sampling, min_p, top_p) ws->w[0..n_vocab) is indexed by token
 *           id, 0 for every token outside the kept set; the weights come from one fused
 *           vectorized pass over the logits (vexp.c), with no candidate list. For a draw
 *           (ws->prefix) w[i] holds instead the running sum of the weights through token i, and
 *           the token is found by binary search: the first i whose running sum exceeds
 *           u * total is the one a walk over the kept set would stop at.
 *   sparse  (top_k cuts) ws->cand[0..n_kept) is the kept set in increasing id order (logit with
 *           +inf clamped to FLT_MAX, token id) and ws->w[0..n_kept) their weights.
 * Either way the weights' sum in increasing id order is the returned total (>= 1: the most likely
 * token has weight exactly 1 and is always kept), and zeros added to a double sum change nothing,
 * so both layouts draw the same token as a walk over the kept set alone.
 */
#include "sampling.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "pc_alloc.h"
#include "pc_err.h"
#include "pc_exp.h"
#include "vexp.h"

typedef struct cand {
    float logit;
    uint32_t id;
} cand_t;

struct eng_sample_ws {
    uint32_t n_vocab;
    cand_t *cand;  /* [n_vocab] */
    cand_t *tmp;   /* [n_vocab] the top_p boundary bucket */
    double *w;     /* [n_vocab] */
    uint16_t *bkt; /* [n_vocab] top_p: each token's bucket */
    bool dense;    /* the layout of the last prepare() (file comment) */
    bool prefix;   /* dense: w holds running sums */
    /* The dense kept set, to tell which tokens have a weight when a draw needs to: candidates
     * with logit >= thr and, when cut, not after `last` in the candidate order. */
    double mx, inv_t, thr;
    bool cut;
    struct cand last;
};

/* Up to this k, top-k selection keeps a heap of k (O(n log k), with a cheap rejection test for
 * most elements); above it, quickselect (O(n) expected). */
#define HEAP_SELECT_MAX 256
/* Up to this k, the heap is kept straight from the logits (heap_stream): with logits in no
 * particular order only about k ln(n / k) of them enter it, each in O(log k). */
#define HEAP_STREAM_MAX 2048
/* top_p without top_k: mass histogram over -log(weight) in [0, TOP_P_SPAN). */
#define TOP_P_BUCKETS 1024
#define TOP_P_SPAN 32.0

eng_sampling_params_t eng_sampling_params_default(void)
{
    return (eng_sampling_params_t){
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0};
}

static int check_fail(char *err, size_t err_len, const char *what, double v)
{
    if (err != NULL && err_len > 0)
        snprintf(err, err_len, "sampling: %s (got %g)", what, v);
    return PC_ERR_INVAL;
}

int eng_sampling_params_check(const eng_sampling_params_t *p, char *err, size_t err_len)
{
    if (!isfinite(p->temperature) || p->temperature < 0)
        return check_fail(err, err_len, "temperature must be a finite number >= 0", p->temperature);
    if (!isfinite(p->top_p) || !(p->top_p > 0 && p->top_p <= 1))
        return check_fail(err, err_len, "top_p must be in (0, 1]", p->top_p);
    if (!isfinite(p->min_p) || !(p->min_p >= 0 && p->min_p <= 1))
        return check_fail(err, err_len, "min_p must be in [0, 1]", p->min_p);
    return 0;
}

/* ---- PRNG ---------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void eng_rng_seed(eng_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    /* splitmix64 is a bijection of a counter, so four outputs are never all zero; keep the
     * guard anyway because xoshiro's all-zero state is a fixed point. */
    if ((r->s[0] | r->s[1] | r->s[2] | r->s[3]) == 0)
        r->s[0] = 1;
}

uint64_t eng_rng_next(eng_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double eng_rng_uniform(eng_rng_t *r)
{
    return (double)(eng_rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- scratch ------------------------------------------------------------------------------- */

int eng_sample_ws_init(uint32_t n_vocab, eng_sample_ws_t **out)
{
    *out = NULL;
    if (n_vocab == 0)
        return PC_ERR_INVAL;
    eng_sample_ws_t *ws = pc_calloc(1, sizeof *ws);
    if (ws == NULL)
        return PC_ERR_NOMEM;
    ws->n_vocab = n_vocab;
    ws->cand = pc_malloc((size_t)n_vocab * sizeof *ws->cand);
    ws->tmp = pc_malloc((size_t)n_vocab * sizeof *ws->tmp);
    ws->w = pc_malloc((size_t)n_vocab * sizeof *ws->w);
    ws->bkt = pc_malloc((size_t)n_vocab * sizeof *ws->bkt);
    if (ws->cand == NULL || ws->tmp == NULL || ws->w == NULL || ws->bkt == NULL) {
        eng_sample_ws_free(ws);
        return PC_ERR_NOMEM;
    }
    *out = ws;
    return 0;
}

void eng_sample_ws_free(eng_sample_ws_t *ws)
{
    if (ws == NULL)
        return;
    pc_free(ws->cand);
    pc_free(ws->tmp);
    pc_free(ws->w);
    pc_free(ws->bkt);
    pc_free(ws);
}

int eng_sampler_init(eng_sampler_t *s, const eng_sampling_params_t *p, char *err, size_t err_len)
{
    int rc = eng_sampling_params_check(p, err, err_len);
    if (rc != 0)
        return rc;
    s->params = *p;
    eng_rng_seed(&s->rng, p->seed);
    return 0;
}

/* ---- selection ----------------------------------------------------------------------------- */

/* The candidate order: higher logit first, ties by lower id. A strict total order (ids are
 * unique), so every selection and sort below has one possible result. */
static inline bool before(cand_t a, cand_t b)
{
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

static int cand_cmp(const void *pa, const void *pb)
{
    cand_t a = *(const cand_t *)pa, b = *(const cand_t *)pb;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

static inline void swap_cand(cand_t *a, cand_t *b)
{
    cand_t t = *a;
    *a = *b;
    *b = t;
}

/* Min-heap on `before`: the root is the worst of the heap. */
static void heap_sift_down(cand_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && before(h[worst], h[l]))
            worst = l;
        if (r < n && before(h[worst], h[r]))
            worst = r;
        if (worst == i)
            return;
        swap_cand(&h[i], &h[worst]);
        i = worst;
    }
}

static void select_heap(cand_t *c, size_t n, size_t k)
{
    for (size_t i = k / 2; i-- > 0;)
        heap_sift_down(c, k, i);
    for (size_t i = k; i < n; i++) {
        if (before(c[i], c[0])) {
            swap_cand(&c[i], &c[0]);
            heap_sift_down(c, k, 0);
        }
    }
}

/* Quickselect (Hoare-style partition, median-of-three pivot) so that c[0..k) are the k first in
 * order. When the recursion budget runs out (adversarial input), the remaining range is sorted,
 * which bounds the worst case at O(n log n). */
static void select_quick(cand_t *c, size_t n, size_t k)
{
    size_t lo = 0, hi = n; /* the boundary k lies in [lo, hi) */
    int budget = 64;
    while (hi - lo > 16) {
        if (budget-- == 0) {
            qsort(c + lo, hi - lo, sizeof *c, cand_cmp);
            return;
        }
        size_t mid = lo + (hi - lo) / 2;
        /* Median of three into c[mid]. */
        if (before(c[mid], c[lo]))
            swap_cand(&c[mid], &c[lo]);
        if (before(c[hi - 1], c[lo]))
            swap_cand(&c[hi - 1], &c[lo]);
        if (before(c[hi - 1], c[mid]))
            swap_cand(&c[hi - 1], &c[mid]);
        cand_t pivot = c[mid];
        swap_cand(&c[mid], &c[hi - 1]);
        size_t store = lo;
        for (size_t i = lo; i < hi - 1; i++) {
            if (before(c[i], pivot))
                swap_cand(&c[i], &c[store++]);
        }
        swap_cand(&c[store], &c[hi - 1]);
        /* c[lo..store) precede the pivot, c[store] is the pivot, c(store..hi) follow it. */
        if (store == k || store + 1 == k)
            return;
        if (k < store)
            hi = store;
        else
            lo = store + 1;
    }
    qsort(c + lo, hi - lo, sizeof *c, cand_cmp);
}

/* Moves the k first candidates (in order) to c[0..k), sorted. */
static void select_sorted(cand_t *c, size_t n, size_t k)
{
    if (k < n) {
        if (k <= HEAP_SELECT_MAX)
            select_heap(c, n, k);
        else
            select_quick(c, n, k);
    }
    qsort(c, k, sizeof *c, cand_cmp);
}

/* ---- the distribution ---------------------------------------------------------------------- */

static inline bool is_greedy(const eng_sampling_params_t *p)
{
    return p->temperature == 0 || p->top_k == 1;
}

static inline float clamp_logit(float x)
{
    return x > FLT_MAX ? FLT_MAX : x; /* NaN stays NaN */
}

int eng_sample_greedy(const float *logits, uint32_t n, uint32_t *token)
{
    /* The maximum ignoring NaN (+inf wins), then its first occurrence: the lowest id among
     * ties. -inf is no candidate, so an all -inf (or NaN) row has none. */
    float best_v = eng_vexp_logit_max(logits, n);
    if (!(best_v > -INFINITY))
        return PC_ERR_INVAL;
    uint32_t i = 0;
    while (logits[i] != best_v)
        i++;
    *token = i;
    return 0;
}

static int cand_cmp_id(const void *pa, const void *pb)
{
    uint32_t a = ((const cand_t *)pa)->id, b = ((const cand_t *)pb)->id;
    return a < b ? -1 : a > b ? 1 : 0;
}

/* The weight of a candidate: its unnormalized probability, 1 for the most likely one. */
static inline double weight(float logit, double mx, double inv_t)
{
    return eng_vexp(((double)logit - mx) * inv_t);
}

/* top_p over every candidate (no top_k cut), dense layout, in O(n) plus a sort of one bucket:
 * the weights and their mass come from one vectorized pass; the mass per bucket finds the bucket
 * where the cumulative mass reaches the target; only its members need ordering. Then the tokens
 * after the last kept one (in candidate order) get weight 0. Returns the total. */
static double top_p_dense(eng_sample_ws_t *ws, const float *logits, size_t n, double mx,
                          double inv_t, double thr, double top_p, bool prefix)
{
    double *w = ws->w;
    double mass = eng_vexp_weights(logits, n, mx, inv_t, thr, false, w);
    /* Every token's bucket: the buckets split d = -log(weight) = (max - x) / T in
     * [0, TOP_P_SPAN) evenly, everything beyond goes to the last one. Monotone in the candidate
     * order, so each bucket is a contiguous run of it. (d * 32 is exact; NaN and -inf, whose d
     * is NaN or +inf, land in the last bucket and have weight 0.) */
    uint16_t *bkt = ws->bkt;
    _Static_assert(TOP_P_BUCKETS == 32 * (int)TOP_P_SPAN, "the scale 32 makes d * scale exact");
    for (size_t i = 0; i < n; i++) {
        double f = (mx - (double)clamp_logit(logits[i])) * inv_t * (TOP_P_BUCKETS / TOP_P_SPAN);
        f = f < TOP_P_BUCKETS - 1 ? f : TOP_P_BUCKETS - 1;
        bkt[i] = (uint16_t)f;
    }
    double bmass[TOP_P_BUCKETS] = {0};
    /* Only candidates have a nonzero weight, and a zero adds nothing to a bucket's mass. */
    for (size_t i = 0; i < n; i++)
        if (w[i] != 0)
            bmass[bkt[i]] += w[i];
    double want = top_p * mass, cum = 0;
    size_t bb = 0;
    while (bb < TOP_P_BUCKETS - 1 && cum + bmass[bb] < want)
        cum += bmass[bb++];
    cand_t *t = ws->tmp;
    size_t nt = 0;
    for (size_t i = 0; i < n; i++) {
        float x = clamp_logit(logits[i]);
        if (bkt[i] == bb && x > -INFINITY && (double)x >= thr)
            t[nt++] = (cand_t){x, (uint32_t)i};
    }
    if (nt == 0) { /* only when rounding ran past every bucket: keep everything */
        if (prefix) {
            double run = 0;
            for (size_t i = 0; i < n; i++)
                w[i] = run += w[i];
        }
        return mass;
    }
    qsort(t, nt, sizeof *t, cand_cmp);
    cand_t last = t[nt - 1];
    for (size_t i = 0; i < nt; i++) {
        cum += w[t[i].id];
        if (cum >= want) {
            last = t[i];
            break;
        }
    }
    /* Buckets are monotone in the candidate order, so the kept set is every candidate not
     * after `last` in that order (NaN compares false and already has weight 0). */
    ws->cut = true;
    ws->last = last;
    double total = 0;
    for (size_t i = 0; i < n; i++) {
        float x = clamp_logit(logits[i]);
        double e = x > last.logit || (x == last.logit && i <= last.id) ? w[i] : 0.0;
        total += e;
        w[i] = prefix ? total : e;
    }
    return total;
}

/* The first k candidates of logits[n] (not NaN, not -inf, clamped logit >= thr) in candidate
 * order, as a heap in h[0..k), straight from the logits: no candidate list is written, and most
 * logits fail one comparison with the heap's worst. Returns true when there are more than k
 * candidates (so top_k cuts), false otherwise (h then holds what there is, not a heap). */
static bool heap_stream(const float *logits, uint32_t n, double thr, size_t k, cand_t *h)
{
    size_t m = 0;
    uint32_t i = 0;
    for (; i < n && m < k; i++) {
        float x = clamp_logit(logits[i]);
        if (x > -INFINITY && (double)x >= thr) /* false for NaN and -inf */
            h[m++] = (cand_t){x, i};
    }
    if (m < k)
        return false;
    for (size_t j = k / 2; j-- > 0;)
        heap_sift_down(h, k, j);
    bool more = false;
    for (; i < n; i++) {
        float x = clamp_logit(logits[i]);
        if (!(x >= h[0].logit)) { /* below the worst kept (or NaN): only note a candidate */
            if (!more && x > -INFINITY && (double)x >= thr)
                more = true;
            continue;
        }
        if (!((double)x >= thr)) /* x >= a candidate's logit, so only min_p can refuse it */
            continue;
        more = true; /* x or the root it might displace is a candidate beyond the first k */
        cand_t cx = {x, i};
        if (before(cx, h[0])) {
            h[0] = cx;
            heap_sift_down(h, k, 0);
        }
    }
    return more;
}

/* Fills the kept set (see the file comment) in ws->cand[0..n_kept) in id order, with weights
 * in ws->w. Returns 0 with *n_kept and *total, or PC_ERR_INVAL when there is no candidate. */
static int prepare(const eng_sampling_params_t *p, eng_sample_ws_t *ws, const float *logits,
                   uint32_t n_vocab, bool prefix, size_t *n_kept, double *total)
{
    if (n_vocab == 0 || n_vocab > ws->n_vocab)
        return PC_ERR_INVAL;
    cand_t *c = ws->cand;
    double *w = ws->w;
    if (is_greedy(p)) {
        uint32_t id = 0;
        if (eng_sample_greedy(logits, n_vocab, &id) != 0)
            return PC_ERR_INVAL;
        c[0] = (cand_t){logits[id], id};
        w[0] = 1.0;
        ws->dense = false;
        *n_kept = 1;
        *total = 1.0;
        return 0;
    }

    float maxv = clamp_logit(eng_vexp_logit_max(logits, n_vocab));
    if (!(maxv > -INFINITY))
        return PC_ERR_INVAL;

    double inv_t = 1.0 / (double)p->temperature;
    double mx = (double)maxv;
    /* min_p: exp((x - max) / T) >= min_p  <=>  x >= max + T * ln(min_p). */
    double thr = p->min_p > 0 ? mx + (double)p->temperature * log((double)p->min_p) : -INFINITY;
    if (p->top_k == 0 || p->top_k >= n_vocab)
        goto dense;
    size_t k = p->top_k, kept = k;
    if (k <= HEAP_STREAM_MAX) {
        /* top_k keeps every candidate (no cut after all) when there are no more than k. */
        if (!heap_stream(logits, n_vocab, thr, k, c))
            goto dense;
        qsort(c, k, sizeof *c, cand_cmp);
    } else {
        size_t n = 0;
        for (uint32_t i = 0; i < n_vocab; i++) {
            float x = clamp_logit(logits[i]);
            if (x > -INFINITY && (double)x >= thr) /* false for NaN and -inf */
                c[n++] = (cand_t){x, i};
        }
        if (k >= n)
            goto dense;
        select_sorted(c, n, k);
    }
    if (p->top_p < 1.0f) {
        double mass = 0, cum = 0;
        for (size_t j = 0; j < k; j++)
            mass += weight(c[j].logit, mx, inv_t);
        double want = (double)p->top_p * mass;
        for (kept = 0; kept < k;) {
            cum += weight(c[kept++].logit, mx, inv_t);
            if (cum >= want)
                break;
        }
    }
    qsort(c, kept, sizeof *c, cand_cmp_id);
    double sum = 0;
    for (size_t j = 0; j < kept; j++)
        sum += w[j] = weight(c[j].logit, mx, inv_t);
    ws->dense = false;
    *n_kept = kept;
    *total = sum;
    return 0;

dense:
    ws->dense = true;
    ws->prefix = prefix;
    ws->mx = mx;
    ws->inv_t = inv_t;
    ws->thr = thr;
    ws->cut = false;
    *n_kept = n_vocab;
    *total = p->top_p < 1.0f
                 ? top_p_dense(ws, logits, n_vocab, mx, inv_t, thr, (double)p->top_p, prefix)
                 : eng_vexp_weights(logits, n_vocab, mx, inv_t, thr, prefix, w);
    return 0;
}

/* Whether token i has a nonzero weight in the dense kept set of the last prepare(). */
static bool dense_has_weight(const eng_sample_ws_t *ws, const float *logits, size_t i)
{
    float x = clamp_logit(logits[i]);
    if (!(x > -INFINITY) || !((double)x >= ws->thr))
        return false;
    if (ws->cut && !(x > ws->last.logit || (x == ws->last.logit && i <= ws->last.id)))
        return false;
    return pc_exp(((double)x - ws->mx) * ws->inv_t) > 0;
}

/* The draw over running sums P = ws->w[0..n): the first i with P[i] > u. P[i] > P[i - 1] there
 * (P[-1] = 0 <= u), so token i has a weight, and every token before it with a weight had a
 * running sum <= u: exactly where the walk stops. Some P[i] always exceeds u, since u is
 * u' * total with u' <= 1 - 2^-53 and total = P[n - 1] >= 1, a product that rounds below total;
 * should none, the walk's answer is kept: the last token with a nonzero weight (found
 * backwards, since a weight that rounding absorbed into the sum leaves no trace in P). */
static uint32_t draw_prefix(const eng_sample_ws_t *ws, const float *logits, size_t n, double u)
{
    const double *P = ws->w;
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (P[mid] > u)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo < n)
        return (uint32_t)lo;
    for (size_t i = n; i-- > 0;)
        if (dense_has_weight(ws, logits, i))
            return (uint32_t)i;
    return 0; /* unreachable: the most likely token has weight 1 */
}

int eng_sampler_sample(eng_sampler_t *s, eng_sample_ws_t *ws, const float *logits, uint32_t n_vocab,
                       uint32_t *token)
{
    size_t n_kept;
    double total;
    int rc = prepare(&s->params, ws, logits, n_vocab, true, &n_kept, &total);
    if (rc != 0)
        return rc;
    if (n_kept == 1 && !ws->dense && is_greedy(&s->params)) {
        *token = ws->cand[0].id;
        return 0;
    }
    double u = eng_rng_uniform(&s->rng) * total;
    if (ws->dense && ws->prefix) {
        *token = draw_prefix(ws, logits, n_kept, u);
        return 0;
    }
    double cum = 0;
    size_t last = 0;
    for (size_t j = 0; j < n_kept; j++) {
        if (ws->w[j] <= 0)
            continue;
        cum += ws->w[j];
        last = j;
        if (u < cum)
            break;
    }
    /* u < total, but the running sum can round below it on the last step: then the last token
     * with a weight is the pick. */
    *token = ws->dense ? (uint32_t)last : ws->cand[last].id;
    return 0;
}

void eng_sampler_peek(const eng_sampler_t *s, eng_sample_row_t *row)
{
    const eng_sampling_params_t *p = &s->params;
    eng_rng_t next = s->rng;
    *row = (eng_sample_row_t){.temperature = p->temperature,
                              .top_k = p->top_k,
                              .top_p = p->top_p,
                              .min_p = p->min_p,
                              .u = is_greedy(p) ? 0.0 : eng_rng_uniform(&next)};
}

void eng_sampler_advance(eng_sampler_t *s)
{
    if (!is_greedy(&s->params))
        (void)eng_rng_next(&s->rng);
}

int eng_sample_probs(const eng_sampling_params_t *p, eng_sample_ws_t *ws, const float *logits,
                     uint32_t n_vocab, float *probs)
{
    size_t n_kept;
    double total;
    int rc = prepare(p, ws, logits, n_vocab, false, &n_kept, &total);
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < n_vocab; i++)
        probs[i] = 0;
    for (size_t j = 0; j < n_kept; j++)
        probs[ws->dense ? j : ws->cand[j].id] = (float)(ws->w[j] / total);
    return 0;
}

void eng_sample_exp_row(const double *x, double *y, size_t n)
{
    eng_vexp_row_isa(x, y, n, ENG_CPU_ISA_AUTO);
}
