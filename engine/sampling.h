/*
 * sampling.h — per-request token sampling over a logits vector: part of the engine's public face.
 * The rules below are the worker protocol's (engine/wire.h carries eng_sampling_params_t, and a
 * request's tokens follow from its seed by them); the gateway checks requests with
 * eng_sampling_params_check, the worker's scheduler samples with eng_sampler_*.
 *
 * The distribution a sampler draws from is defined exactly, so that tests can compare it with a
 * naive reference and so that the same seed gives the same tokens on every machine:
 *
 *   1. Candidates are the tokens whose logit is not NaN and not -inf. +inf counts as the largest
 *      finite float (so several +inf tokens share the mass equally). No candidate at all (every
 *      logit NaN or -inf) is an error, never a silent token 0.
 *   2. Candidates are ordered by logit, highest first, ties by lowest token id. Every filter
 *      keeps a prefix of that order, so the kept set is exact and deterministic:
 *        top_k  (0 = off)  the first top_k candidates;
 *        min_p  (0 = off)  the candidates whose probability is >= min_p times the probability
 *                          of the most likely one (on the temperature-scaled distribution);
 *        top_p  (1 = off)  of what top_k and min_p kept, the shortest prefix whose probability
 *                          mass, renormalized over that set, reaches top_p.
 *   3. Kept token i gets weight pc_exp(((double)logit_i - (double)max_logit) * (1.0 / (double)
 *      temperature)), where pc_exp is the exp() that common/pc_exp.h defines step by step (never
 *      the platform's libm). total is the kept weights added in increasing id order, one double
 *      addition at a time. One draw u in [0, 1) of the request's PRNG picks the first kept token,
 *      in increasing id order, whose running sum of weights (added in the same order) exceeds
 *      u * total; when rounding leaves none, the last kept token with a nonzero weight.
 *
 * temperature 0 (or top_k 1) is greedy: the argmax, ties by lowest id, no PRNG draw. Nothing
 * else ever changes the distribution: there is no repetition penalty (repetition-free by
 * default means the sampler has no memory of earlier tokens apart from its PRNG state).
 *
 * PRNG: xoshiro256** (Blackman and Vigna, 2018), its state seeded from the 64-bit request seed
 * by four outputs of splitmix64. Each non-greedy sample consumes exactly one 64-bit output,
 * turned into a double in [0, 1) from its top 53 bits.
 *
 * Determinism: every step above is integer or IEEE double arithmetic in a fixed order (the
 * filters' thresholds included: min_p compares logits with max + T * ln(min_p), the one libm
 * call, made once per sample, and top_p adds in a fixed order too), and pc_exp returns the same
 * bits on every ISA path and machine. So the same seed and the same logits give the same tokens,
 * run after run, on every CPU path (avx512, avx2, portable) and every machine with IEEE doubles,
 * whatever its libm, with one exception: a min_p > 0 threshold uses libm's log(), so a min_p
 * token that sits exactly on the threshold may fall either side on another libm. The GPU
 * sampler (kernels/krn_sample.cu) uses CUDA's exp() and is compared with this one within a
 * tolerance; its CPU reference (kernels/ref/krn_ref_sample.c) uses pc_exp and picks exactly as
 * this sampler does.
 *
 * Speed: greedy is a vectorized pass for the maximum and a scan to its first occurrence.
 * Sampling without a top_k cut (plain, min_p, top_p) is the vectorized maximum, then one fused
 * vectorized pass that computes every weight and its running sum (engine/vexp.h; about 0.75 ns
 * per token with AVX-512), with no candidate list, and a binary search for the draw. top_k up to
 * 2048 keeps a heap of k straight from the logits (most fail one comparison with its worst);
 * larger k build a candidate list and quickselect it; either way only the k survivors are
 * weighed. top_p without top_k adds a mass histogram over -log(probability) in 1024 buckets,
 * which finds the one bucket where the cumulative mass crosses top_p, and only that bucket is
 * sorted (exact: the kept set is the same as a full sort's). `kvgw bench sampler` prints the
 * figures.
 */
#ifndef ENG_SAMPLING_H
#define ENG_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

typedef struct eng_sampling_params {
    float temperature; /* >= 0; 0 = greedy. Default 1 */
    uint32_t top_k;    /* 0 = off. Default 0 */
    float top_p;       /* (0, 1]; 1 = off. Default 1 */
    float min_p;       /* [0, 1]; 0 = off. Default 0 */
    uint64_t seed;     /* PRNG seed. Default 0 */
} eng_sampling_params_t;

/* temperature 1, top_k 0, top_p 1, min_p 0, seed 0: plain sampling from the softmax. */
eng_sampling_params_t eng_sampling_params_default(void);

/* Checks the ranges above (every float finite). Returns 0, or
 * PC_ERR_INVAL with a one-line reason in err (may be NULL). */
int eng_sampling_params_check(const eng_sampling_params_t *p, char *err, size_t err_len);

/* xoshiro256** state. Caller-allocated, plain data: copy it to fork a stream. */
typedef struct eng_rng {
    uint64_t s[4];
} eng_rng_t;

/* Seeds the state from a 64-bit seed through splitmix64 (never the all-zero state). */
void eng_rng_seed(eng_rng_t *r, uint64_t seed);
/* The next 64-bit output. */
uint64_t eng_rng_next(eng_rng_t *r);
/* A double uniform in [0, 1): the top 53 bits of one output. */
double eng_rng_uniform(eng_rng_t *r);

/* Scratch space for sampling over n_vocab logits: one per thread that samples (the scheduler
 * samples every sequence of a step with the same one). Owns 26 bytes per vocab entry. */
typedef struct eng_sample_ws eng_sample_ws_t;

/* Returns 0 or PC_ERR_NOMEM / PC_ERR_INVAL (n_vocab 0). */
int eng_sample_ws_init(uint32_t n_vocab, eng_sample_ws_t **out);
void eng_sample_ws_free(eng_sample_ws_t *ws);

/* A request's sampler: its parameters and PRNG. Caller-allocated, embedded in the sequence. */
typedef struct eng_sampler {
    eng_sampling_params_t params;
    eng_rng_t rng;
} eng_sampler_t;

/* Checks the parameters (as eng_sampling_params_check) and seeds the PRNG from params->seed.
 * Returns 0 or PC_ERR_INVAL (s is unchanged then). */
int eng_sampler_init(eng_sampler_t *s, const eng_sampling_params_t *p, char *err, size_t err_len);

/* Picks the next token from logits[n_vocab] (n_vocab <= the scratch's). Writes *token and
 * returns 0, or PC_ERR_INVAL (no candidate: every logit is NaN or -inf; n_vocab 0 or too large
 * for ws), in which case the PRNG state is unchanged. */
int eng_sampler_sample(eng_sampler_t *s, eng_sample_ws_t *ws, const float *logits, uint32_t n_vocab,
                       uint32_t *token);

/* One sampling decision handed to a sampler that runs elsewhere (the cuda backend samples on
 * its device, kernels/krn_sample.cu): the request's rules and the uniform draw that
 * eng_sampler_sample would make, so both pick the same token from the same logits. */
typedef struct eng_sample_row {
    float temperature;
    uint32_t top_k;
    float top_p;
    float min_p;
    double u; /* in [0, 1); 0 when greedy (no draw) */
} eng_sample_row_t;

/* Fills *row with s's rules and its next draw without consuming it: u is the uniform that the
 * next eng_sampler_sample would draw (one PRNG output unless greedy). A caller that got the
 * token picked under row then calls eng_sampler_advance, which leaves the PRNG exactly where
 * eng_sampler_sample would have left it; one that did not (the step failed) calls nothing and
 * may peek again. (eng_sampler_sample leaves the PRNG unchanged when no logit is a candidate;
 * a request is failed then, so its PRNG state no longer matters.) */
void eng_sampler_peek(const eng_sampler_t *s, eng_sample_row_t *row);
/* Consumes the draw eng_sampler_peek showed (nothing when greedy). */
void eng_sampler_advance(eng_sampler_t *s);

/* The exact distribution eng_sampler_sample draws from under params p: writes probs[n_vocab]
 * (0 outside the kept set, summing to 1; greedy puts 1 on the argmax). For tests and for
 * log-probabilities. Returns 0 or PC_ERR_INVAL as eng_sampler_sample. */
int eng_sample_probs(const eng_sampling_params_t *p, eng_sample_ws_t *ws, const float *logits,
                     uint32_t n_vocab, float *probs);

/* The argmax of logits[n] (NaN and -inf skipped, +inf wins, ties by lowest id). Returns 0 and
 * writes *token, or PC_ERR_INVAL when no logit is a candidate (all NaN or -inf, or n 0). */
int eng_sample_greedy(const float *logits, uint32_t n, uint32_t *token);

/* y[i] = pc_exp(x[i]) for i < n, the exponential the sampler weighs tokens with, on the best
 * path this CPU runs (for `kvgw bench sampler`). x and y may be the same array. */
void eng_sample_exp_row(const double *x, double *y, size_t n);

#endif
