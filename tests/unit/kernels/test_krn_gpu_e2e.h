/*
 * test_krn_gpu_e2e.h — the end-to-end part of test_krn_gpu.c: the engine on the cuda backend
 * against the engine on the cpu backend over generated models (llama with Llama 3.1 RoPE
 * factors, qwen2 with q/k/v biases, qwen3 with q/k head norms; F32 and F16 weights; F16 and F32
 * KV), prefix reuse on the GPU against a cold run (logits within 1e-3), and sampling on the
 * GPU against the host sampler, and the step's paths (fused kernels and GEMMs, packed upload,
 * CUDA graph replays) against the unfused step and the cpu engine; the split-KV decode kernel
 * in decode steps (contexts of thousands of positions in small blocks, so steps split the KV
 * range) against the cpu engine and against krn_attention's plan (KVGW_CUDA_DECODE=attn).
 */
#include "eng_testmodel.h"
#include "mkmodel.h"
#include "sampling.h"

enum { E2E_VOCAB = 300 };

/* A 2-layer model; head_dim 16 (n_embd 128, 8 heads over 2 KV heads) unless `wide`: then
 * n_embd 256 and head_dim 32 (GQA 4:1), a shape the split-KV decode kernel takes
 * (krn_decode_check: head_dim a multiple of 32), with an 8192-position context. */
static eng_mkmodel_params_t e2e_params(enum eng_arch arch, uint32_t dtype, bool wide)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.arch = arch;
    p.n_layer = 2;
    p.n_embd = wide ? 256 : 128;
    p.n_head = 8;
    p.n_head_kv = 2;
    p.n_ff = 256;
    p.n_ctx = wide ? 8192 : 4096;
    p.dtype = dtype;
    p.rope_theta = 500000.0f;
    p.rope_freqs = arch == ENG_ARCH_LLAMA;
    p.seed = 17;
    return p;
}

/* Writes the model of p (E2E_VOCAB tokens) to a temporary file named in path. */
static void e2e_make(eng_mkmodel_params_t *p, char *path, size_t len)
{
    char err[256];
    if (tm_make(p, E2E_VOCAB, path, len, err, sizeof err) != 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        abort();
    }
}

static void e2e_model_ex(enum eng_arch arch, uint32_t dtype, bool wide, char *path, size_t len)
{
    eng_mkmodel_params_t p = e2e_params(arch, dtype, wide);
    e2e_make(&p, path, len);
}

static void e2e_model(enum eng_arch arch, uint32_t dtype, char *path, size_t len)
{
    e2e_model_ex(arch, dtype, false, path, len);
}

static eng_t *e2e_engine_ex(const char *path, const char *backend, enum eng_kv_dtype kvt,
                            bool host_sampling)
{
    eng_params_t p = eng_params_default();
    p.host_sampling = host_sampling;
    p.model_path = path;
    p.backend = backend;
    p.kv_dtype = kvt;
    p.kv_max_tokens = 8192;
    p.kv_poison = true;
    p.max_batch_tokens = 256;
    eng_t *e = NULL;
    char err[256];
    if (eng_init(&p, &e, err, sizeof err) != 0)
        fprintf(stderr, "eng_init(%s): %s\n", backend, err);
    return e;
}

static eng_t *e2e_engine(const char *path, const char *backend, enum eng_kv_dtype kvt)
{
    return e2e_engine_ex(path, backend, kvt, false);
}

/* Prefill of n tokens (every row's logits), then decode steps; logits into out. */
static int e2e_run(eng_t *e, const int32_t *toks, uint32_t n_prefill, uint32_t n_decode, float *out)
{
    eng_seq_t *s;
    if (eng_seq_create(e, &s) != 0)
        return -1;
    uint32_t V = eng_n_vocab(e);
    eng_batch_item_t it = {
        .seq = s, .tokens = toks, .n_tokens = n_prefill, .logits = ENG_LOGITS_ALL};
    int rc = eng_forward(e, &it, 1, out);
    for (uint32_t i = 0; rc == 0 && i < n_decode; i++) {
        it = (eng_batch_item_t){
            .seq = s, .tokens = toks + n_prefill + i, .n_tokens = 1, .logits = ENG_LOGITS_LAST};
        rc = eng_forward(e, &it, 1, out + (size_t)(n_prefill + i) * V);
    }
    eng_seq_free(e, s);
    return rc;
}

PC_TEST(cuda_engine_logits_match_cpu_engine)
{
    NEED_GPU();
    const struct {
        enum eng_arch arch;
        uint32_t dtype;
        enum eng_kv_dtype kv;
    } cases[] = {{ENG_ARCH_LLAMA, ENG_GGML_TYPE_F32, ENG_KV_F32},
                 {ENG_ARCH_LLAMA, ENG_GGML_TYPE_F16, ENG_KV_F16},
                 {ENG_ARCH_QWEN2, ENG_GGML_TYPE_F32, ENG_KV_F16},
                 {ENG_ARCH_QWEN3, ENG_GGML_TYPE_BF16, ENG_KV_F16}};
    kt_rng_t r = {31};
    enum { NP = 300, ND = 6 }; /* a prefill longer than one step (256), then decode */
    int32_t toks[NP + ND];
    for (int i = 0; i < NP + ND; i++)
        toks[i] = (int32_t)kt_below(&r, E2E_VOCAB);
    for (size_t ci = 0; ci < PC_ARRAY_LEN(cases); ci++) {
        char path[256];
        e2e_model(cases[ci].arch, cases[ci].dtype, path, sizeof path);
        eng_t *cpu = e2e_engine(path, "cpu", cases[ci].kv),
              *gpu = e2e_engine(path, "cuda", cases[ci].kv);
        ASSERT_TRUE(cpu != NULL && gpu != NULL);
        ASSERT_STR_EQ(eng_backend_name_of(gpu), "cuda");
        size_t n = (size_t)(NP + ND) * E2E_VOCAB;
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        ASSERT_EQ(e2e_run(cpu, toks, NP, ND, a), 0);
        ASSERT_EQ(e2e_run(gpu, toks, NP, ND, b), 0);
        double err = kt_rel_err_f(b, a, (int64_t)n);
        char msg[256];
        ASSERT_EQ(eng_check(gpu, msg, sizeof msg), 0);
        eng_free(cpu);
        eng_free(gpu);
        free(a);
        free(b);
        unlink(path);
        ASSERT_LE(err, 1e-2);
    }
}

/* q8_0 KV on both engines (head_dim 32: the wide models): the cuda engine's logits against
 * the cpu engine's over a prefill longer than one step and a few decode steps (prefill on the
 * SIMT kernel, decode on the split-KV kernel, both reading q8_0 in place). */
PC_TEST(cuda_engine_q8_0_kv_logits_match_cpu_engine)
{
    NEED_GPU();
    const struct {
        enum eng_arch arch;
        uint32_t dtype;
    } cases[] = {{ENG_ARCH_LLAMA, ENG_GGML_TYPE_F16}, {ENG_ARCH_QWEN2, ENG_GGML_TYPE_F32}};
    kt_rng_t r = {37};
    enum { NP = 300, ND = 6 };
    int32_t toks[NP + ND];
    for (int i = 0; i < NP + ND; i++)
        toks[i] = (int32_t)kt_below(&r, E2E_VOCAB);
    for (size_t ci = 0; ci < PC_ARRAY_LEN(cases); ci++) {
        char path[256];
        e2e_model_ex(cases[ci].arch, cases[ci].dtype, true, path, sizeof path);
        eng_t *cpu = e2e_engine(path, "cpu", ENG_KV_Q8_0),
              *gpu = e2e_engine(path, "cuda", ENG_KV_Q8_0);
        ASSERT_TRUE(cpu != NULL && gpu != NULL);
        ASSERT_STR_EQ(eng_backend_name_of(gpu), "cuda");
        size_t n = (size_t)(NP + ND) * E2E_VOCAB;
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        ASSERT_EQ(e2e_run(cpu, toks, NP, ND, a), 0);
        ASSERT_EQ(e2e_run(gpu, toks, NP, ND, b), 0);
        double err = kt_rel_err_f(b, a, (int64_t)n);
        char msg[256];
        ASSERT_EQ(eng_check(gpu, msg, sizeof msg), 0);
        eng_free(cpu);
        eng_free(gpu);
        free(a);
        free(b);
        unlink(path);
        ASSERT_LE(err, 1e-2);
    }
}

/* The cuda engine with KVGW_CUDA_DECODE set to `decode` (NULL: unset) while it is created. */
static eng_t *e2e_engine_decode(const char *path, enum eng_kv_dtype kvt, const char *decode)
{
    if (decode != NULL)
        setenv("KVGW_CUDA_DECODE", decode, 1);
    else
        unsetenv("KVGW_CUDA_DECODE");
    eng_t *e = e2e_engine(path, "cuda", kvt);
    unsetenv("KVGW_CUDA_DECODE");
    return e;
}

/* A prompt of n tokens computed cold and the same prompt with its first `cut` positions taken
 * from the prefix cache (a boundary inside a block: the warm sequence copies that block before
 * writing) give the same logits, for the prompt and for GEN decode steps after it. The warm
 * pass is fed the tokens the cold pass picked (greedy), so a near tie that rounding flips
 * cannot make the two diverge: what is compared is the logits, within 1e-3 (the same weights,
 * the same cached K/V; only the batch shapes, hence the GEMMs' summation order, differ).
 * *decode_steps receives the steps that ran the split-KV decode kernel. */
static int prefix_reuse_case(const char *path, const char *decode, uint32_t n, uint32_t cut,
                             uint64_t *decode_steps, char *why, size_t why_len)
{
    enum { GEN = 8 };
    eng_t *e = e2e_engine_decode(path, ENG_KV_F16, decode);
    if (e == NULL) {
        snprintf(why, why_len, "engine init failed");
        return -1;
    }
    kt_rng_t r = {32};
    int32_t *toks = malloc(sizeof *toks * n);
    for (uint32_t i = 0; i < n; i++)
        toks[i] = (int32_t)kt_below(&r, E2E_VOCAB);
    uint32_t V = eng_n_vocab(e);
    float *cold = malloc(sizeof(float) * V * (GEN + 1)),
          *warm = malloc(sizeof(float) * V * (GEN + 1));
    int32_t picks[GEN];
    int rc = 0;
    eng_cuda_stats_t st0, st1;
    eng_cuda_stats_get(&st0);
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        float *logits = pass ? warm : cold;
        eng_seq_t *s;
        if ((rc = eng_seq_create(e, &s)) != 0)
            break;
        uint32_t reused = 0;
        if (pass == 1 &&
            ((rc = eng_seq_start_cached(e, s, 7, toks, n, &reused)) != 0 || reused != cut)) {
            snprintf(why, why_len, "eng_seq_start_cached: rc %d, %u positions reused (want %u)", rc,
                     reused, cut);
            eng_seq_free(e, s);
            rc = -1;
            break;
        }
        eng_batch_item_t it = {
            .seq = s, .tokens = toks + reused, .n_tokens = n - reused, .logits = ENG_LOGITS_LAST};
        rc = eng_forward(e, &it, 1, logits);
        if (rc == 0 && pass == 0)
            rc = eng_prefix_insert(e, s, 7, cut);
        for (int g = 0; g < GEN && rc == 0; g++) {
            const float *lg = logits + (size_t)g * V;
            if (pass == 0) {
                uint32_t best = 0;
                for (uint32_t i = 1; i < V; i++)
                    if (lg[i] > lg[best])
                        best = i;
                picks[g] = (int32_t)best;
            }
            it = (eng_batch_item_t){
                .seq = s, .tokens = &picks[g], .n_tokens = 1, .logits = ENG_LOGITS_LAST};
            rc = eng_forward(e, &it, 1, logits + (size_t)(g + 1) * V);
        }
        eng_seq_free(e, s);
        if (rc != 0 && rc != -1)
            snprintf(why, why_len, "pass %d: %s", pass, pc_strerror(rc));
    }
    eng_cuda_stats_get(&st1);
    *decode_steps = st1.decode_steps - st0.decode_steps;
    char msg[256];
    if (rc == 0 && eng_check(e, msg, sizeof msg) != 0) {
        snprintf(why, why_len, "eng_check: %.200s", msg);
        rc = -1;
    }
    eng_free(e);
    for (int g = 0; g <= GEN && rc == 0; g++) {
        double err = kt_rel_err_f(warm + (size_t)g * V, cold + (size_t)g * V, V);
        if (!(err <= 1e-3)) {
            snprintf(why, why_len, "step %d: warm logits differ from cold ones by %g (> 1e-3)", g,
                     err);
            rc = -1;
        }
    }
    free(toks);
    free(cold);
    free(warm);
    return rc;
}

/* Cached vs cold: the 150-token prompt of the head_dim-16 model (decode steps on krn_attention's
 * plan: the decode kernel does not take head_dim 16), and a 2000-token prompt with 1001 cached
 * on the head_dim-32 model, whose decode steps run the split-KV decode kernel (over 2000
 * positions of 16-token blocks they are split) and, with KVGW_CUDA_DECODE=attn, krn_attention's
 * plan. */
PC_TEST(cuda_prefix_reuse_matches_cold_run)
{
    NEED_GPU();
    char narrow[256], wide[256], why[256] = "";
    e2e_model(ENG_ARCH_LLAMA, ENG_GGML_TYPE_F16, narrow, sizeof narrow);
    e2e_model_ex(ENG_ARCH_LLAMA, ENG_GGML_TYPE_F16, true, wide, sizeof wide);
    const struct {
        const char *path, *decode;
        uint32_t n, cut;
        bool kernel; /* decode steps must run the decode kernel */
    } cases[] = {{narrow, NULL, 150, 101, false},
                 {wide, NULL, 2000, 1001, true},
                 {wide, "attn", 2000, 1001, false}};
    for (size_t ci = 0; ci < PC_ARRAY_LEN(cases); ci++) {
        uint64_t dsteps = 0;
        int rc = prefix_reuse_case(cases[ci].path, cases[ci].decode, cases[ci].n, cases[ci].cut,
                                   &dsteps, why, sizeof why);
        if (rc != 0) {
            unlink(narrow);
            unlink(wide);
            PC_TEST__FAIL("case %zu: %s", ci, why);
        }
        if (cases[ci].kernel ? dsteps < 16 : dsteps != 0) {
            unlink(narrow);
            unlink(wide);
            PC_TEST__FAIL("case %zu: %llu decode steps ran the split-KV decode kernel (want %s)",
                          ci, (unsigned long long)dsteps, cases[ci].kernel ? "all 16" : "none");
        }
    }
    unlink(narrow);
    unlink(wide);
}

/* Sampling on the GPU (eng_forward_sample: krn_sample over the device logits, the request's
 * PRNG draw passed in) picks exactly what the host sampler picks from the same logits, for a
 * batch of sequences with different rules, over a prefill and many decode steps. The same
 * model runs twice on the cuda backend, once sampling on the host (host_sampling): both see
 * the same logits, so their token streams must stay identical. The device engine keeps no host
 * copy of the KV pool. */
PC_TEST(cuda_device_sampling_matches_host_sampling)
{
    NEED_GPU();
    char path[256];
    e2e_model(ENG_ARCH_LLAMA, ENG_GGML_TYPE_F16, path, sizeof path);
    eng_t *dev = e2e_engine_ex(path, "cuda", ENG_KV_F16, false),
          *host = e2e_engine_ex(path, "cuda", ENG_KV_F16, true);
    ASSERT_TRUE(dev != NULL && host != NULL);
    ASSERT_TRUE(eng_samples_on_device(dev));
    ASSERT_TRUE(!eng_samples_on_device(host));
    ASSERT_TRUE(!eng_kvpool_has_storage(eng_kvpool(dev)));
    enum { NS = 5, NP = 40, GEN = 48 };
    const eng_sampling_params_t rules[NS] = {
        {.temperature = 0, .top_p = 1, .seed = 1},
        {.temperature = 1, .top_p = 1, .seed = 2},
        {.temperature = 0.8f, .top_k = 20, .top_p = 1, .seed = 3},
        {.temperature = 1.2f, .top_p = 0.9f, .seed = 4},
        {.temperature = 0.7f, .top_k = 50, .top_p = 0.8f, .min_p = 0.05f, .seed = 5},
    };
    kt_rng_t r = {33};
    eng_seq_t *sd[NS], *sh[NS];
    eng_sampler_t smp_d[NS], smp_h[NS];
    int32_t prompt[NS][NP], next_d[NS], next_h[NS];
    eng_sample_row_t rows[NS];
    eng_batch_item_t it_d[NS], it_h[NS];
    uint32_t V = eng_n_vocab(dev);
    float *logits = malloc(sizeof(float) * NS * V);
    eng_sample_ws_t *ws;
    ASSERT_EQ(eng_sample_ws_init(V, &ws), 0);
    for (int s = 0; s < NS; s++) {
        for (int i = 0; i < NP; i++)
            prompt[s][i] = (int32_t)kt_below(&r, E2E_VOCAB);
        ASSERT_EQ(eng_seq_create(dev, &sd[s]), 0);
        ASSERT_EQ(eng_seq_create(host, &sh[s]), 0);
        ASSERT_EQ(eng_sampler_init(&smp_d[s], &rules[s], NULL, 0), 0);
        ASSERT_EQ(eng_sampler_init(&smp_h[s], &rules[s], NULL, 0), 0);
    }
    for (int step = 0; step <= GEN; step++) {
        for (int s = 0; s < NS; s++) {
            const int32_t *toks = step == 0 ? prompt[s] : &next_d[s];
            uint32_t n = step == 0 ? NP : 1;
            it_d[s] = (eng_batch_item_t){
                .seq = sd[s], .tokens = toks, .n_tokens = n, .logits = ENG_LOGITS_LAST};
            it_h[s] = (eng_batch_item_t){.seq = sh[s],
                                         .tokens = step == 0 ? prompt[s] : &next_h[s],
                                         .n_tokens = n,
                                         .logits = ENG_LOGITS_LAST};
            eng_sampler_peek(&smp_d[s], &rows[s]);
        }
        int32_t got[NS];
        ASSERT_EQ(eng_forward_sample(dev, it_d, NS, rows, got), 0);
        ASSERT_EQ(eng_forward(host, it_h, NS, logits), 0);
        for (int s = 0; s < NS; s++) {
            eng_sampler_advance(&smp_d[s]);
            uint32_t want;
            ASSERT_EQ(eng_sampler_sample(&smp_h[s], ws, logits + (size_t)s * V, V, &want), 0);
            ASSERT_EQ(got[s], (int32_t)want);
            next_d[s] = got[s];
            next_h[s] = (int32_t)want;
        }
    }
    char msg[256];
    ASSERT_EQ(eng_check(dev, msg, sizeof msg), 0);
    for (int s = 0; s < NS; s++) {
        eng_seq_free(dev, sd[s]);
        eng_seq_free(host, sh[s]);
    }
    eng_sample_ws_free(ws);
    free(logits);
    eng_free(dev);
    eng_free(host);
    unlink(path);
}

/* The cuda engine with the step path KVGW_CUDA_FUSED / _PACKED / _GRAPHS select (each "0" or
 * "1"; read when the backend is created). */
static eng_t *e2e_engine_path(const char *path, enum eng_kv_dtype kvt, const char *fused,
                              const char *packed, const char *graphs)
{
    setenv("KVGW_CUDA_FUSED", fused, 1);
    setenv("KVGW_CUDA_PACKED", packed, 1);
    setenv("KVGW_CUDA_GRAPHS", graphs, 1);
    eng_t *e = e2e_engine(path, "cuda", kvt);
    unsetenv("KVGW_CUDA_FUSED");
    unsetenv("KVGW_CUDA_PACKED");
    unsetenv("KVGW_CUDA_GRAPHS");
    return e;
}

/* NS sequences of different prompt lengths (one step of prefills, last rows' logits), then GEN
 * batched decode steps of the given tokens, logits of every step into out[(1 + GEN) * NS][V];
 * with picked, one more step samples on the device (fixed rules and draws, tokens into
 * picked[NS]). */
enum { PATH_NS = 5, PATH_GEN = 40 };
static int e2e_batch_run(eng_t *e, const int32_t *prompt, const int32_t *gen, float *out,
                         int32_t *picked)
{
    static const uint32_t lens[PATH_NS] = {7, 70, 16, 33, 129};
    uint32_t V = eng_n_vocab(e);
    eng_seq_t *s[PATH_NS] = {0};
    eng_batch_item_t it[PATH_NS];
    int rc = 0;
    for (int i = 0; i < PATH_NS && rc == 0; i++) {
        rc = eng_seq_create(e, &s[i]);
        it[i] = (eng_batch_item_t){
            .seq = s[i], .tokens = prompt, .n_tokens = lens[i], .logits = ENG_LOGITS_LAST};
    }
    if (rc == 0)
        rc = eng_forward(e, it, PATH_NS, out);
    for (int g = 0; g < PATH_GEN && rc == 0; g++) {
        for (int i = 0; i < PATH_NS; i++)
            it[i] = (eng_batch_item_t){.seq = s[i],
                                       .tokens = &gen[g * PATH_NS + i],
                                       .n_tokens = 1,
                                       .logits = ENG_LOGITS_LAST};
        rc = eng_forward(e, it, PATH_NS, out + (size_t)(g + 1) * PATH_NS * V);
    }
    if (rc == 0 && picked != NULL) {
        eng_sample_row_t rows[PATH_NS];
        for (int i = 0; i < PATH_NS; i++) {
            rows[i] = (eng_sample_row_t){
                .temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .u = 0.1 + 0.15 * i};
            it[i].tokens = &gen[i];
        }
        rc = eng_forward_sample(e, it, PATH_NS, rows, picked);
    }
    for (int i = 0; i < PATH_NS; i++)
        if (s[i] != NULL)
            eng_seq_free(e, s[i]);
    return rc;
}

/* The fused kernels and GEMMs, the packed upload and the graph replays compute what the
 * unfused step computes: the same batch (prefills of several lengths, then batched decode steps
 * that cross block boundaries, then a device-sampled step) on the cpu engine, the unfused cuda
 * step (KVGW_CUDA_FUSED=0 PACKED=0 GRAPHS=0), the fused one without graphs and the default
 * (fused, packed, graphs). Each against the cpu within 1e-2, fused against unfused within 1e-3
 * (only the GEMMs' summation order differs), graphs against no graphs within 1e-4 (the same
 * kernels: a stale argument in a replayed graph is off by far more), and the sampled step's
 * picks equal with and without graphs. The default path must really have replayed graphs and
 * no capture may have failed. Over llama (F16: fused GEMMs in F16), qwen2 (F32 weights, q/k/v
 * biases) and qwen3 (BF16, head norms). */
PC_TEST(cuda_fused_and_graph_paths_match_unfused)
{
    NEED_GPU();
    const struct {
        enum eng_arch arch;
        uint32_t dtype;
        enum eng_kv_dtype kv;
    } cases[] = {{ENG_ARCH_LLAMA, ENG_GGML_TYPE_F16, ENG_KV_F16},
                 {ENG_ARCH_QWEN2, ENG_GGML_TYPE_F32, ENG_KV_F32},
                 {ENG_ARCH_QWEN3, ENG_GGML_TYPE_BF16, ENG_KV_F16}};
    kt_rng_t r = {34};
    int32_t prompt[129], gen[PATH_GEN * PATH_NS];
    for (size_t i = 0; i < PC_ARRAY_LEN(prompt); i++)
        prompt[i] = (int32_t)kt_below(&r, E2E_VOCAB);
    for (size_t i = 0; i < PC_ARRAY_LEN(gen); i++)
        gen[i] = (int32_t)kt_below(&r, E2E_VOCAB);
    for (size_t ci = 0; ci < PC_ARRAY_LEN(cases); ci++) {
        char path[256];
        e2e_model(cases[ci].arch, cases[ci].dtype, path, sizeof path);
        size_t n = (size_t)(1 + PATH_GEN) * PATH_NS * E2E_VOCAB;
        float *out[4];
        int32_t picked[4][PATH_NS];
        for (int k = 0; k < 4; k++) {
            out[k] = malloc(n * sizeof(float));
            eng_t *e = k == 0   ? e2e_engine(path, "cpu", cases[ci].kv)
                       : k == 1 ? e2e_engine_path(path, cases[ci].kv, "0", "0", "0")
                       : k == 2 ? e2e_engine_path(path, cases[ci].kv, "1", "1", "0")
                                : e2e_engine(path, "cuda", cases[ci].kv); /* the default */
            ASSERT_TRUE(e != NULL);
            eng_cuda_stats_t st0, st1;
            eng_cuda_stats_get(&st0);
            /* The cpu engine samples on the host only: logits steps there. */
            ASSERT_EQ(e2e_batch_run(e, prompt, gen, out[k], k == 0 ? NULL : picked[k]), 0);
            eng_cuda_stats_get(&st1);
            char msg[256];
            ASSERT_EQ(eng_check(e, msg, sizeof msg), 0);
            eng_free(e);
            uint64_t replays = st1.graph_replays - st0.graph_replays;
            uint64_t captures = st1.graph_captures - st0.graph_captures;
            uint64_t failures = st1.graph_failures - st0.graph_failures;
            if (k == 3 && (failures != 0 || replays < PATH_GEN / 2))
                PC_TEST__FAIL("case %zu: %llu graph replays, %llu captures, %llu failed captures "
                              "over %d decode steps (the log says why a capture failed)",
                              ci, (unsigned long long)replays, (unsigned long long)captures,
                              (unsigned long long)failures, PATH_GEN + 1);
            if ((k == 1 || k == 2) && replays + captures != 0)
                PC_TEST__FAIL("case %zu: KVGW_CUDA_GRAPHS=0 still ran graphs", ci);
        }
        double e_cpu[4] = {0}, e_unf = kt_rel_err_f(out[2], out[1], (int64_t)n),
               e_graph = kt_rel_err_f(out[3], out[2], (int64_t)n);
        for (int k = 1; k < 4; k++)
            e_cpu[k] = kt_rel_err_f(out[k], out[0], (int64_t)n);
        for (int k = 0; k < 4; k++)
            free(out[k]);
        unlink(path);
        if (!(e_cpu[1] <= 1e-2 && e_cpu[2] <= 1e-2 && e_cpu[3] <= 1e-2 && e_unf <= 1e-3 &&
              e_graph <= 1e-4))
            PC_TEST__FAIL("case %zu: against the cpu: unfused %g, fused %g, fused+graphs %g "
                          "(<= 1e-2); fused vs unfused %g (<= 1e-3); graphs vs none %g (<= 1e-4)",
                          ci, e_cpu[1], e_cpu[2], e_cpu[3], e_unf, e_graph);
        for (int i = 0; i < PATH_NS; i++)
            if (picked[2][i] != picked[3][i])
                PC_TEST__FAIL("case %zu: sampled row %d picks %d with graphs, %d without", ci, i,
                              picked[3][i], picked[2][i]);
    }
}

/* Decode steps over long contexts, the path that serves them: the same batch of DEC_NS
 * sequences (prompts of up to 3000 positions in 8-position blocks, prefilled one by one, then
 * DEC_GEN batched decode steps with every row's logits, then a mixed step: the DEC_NS decode
 * rows first, as the worker orders them, then a 100-token prefill chunk of another sequence,
 * then one step sampled on the device)
 * on the cpu engine, the cuda engine with KVGW_CUDA_DECODE=attn (krn_attention's plan: split
 * SIMT tasks and a merge), the split-KV decode kernel without graphs, and the default (decode
 * kernel, graphs). At these lengths every decode step splits the KV range (tens of splits per
 * row on any GPU, krn_decode_step_plan). Each cuda path against the cpu within 1e-2; the decode
 * kernel against krn_attention's plan within 1e-3 (both F32 softmax and sums, only their order
 * differs); graphs against none within 1e-4 (the same kernels: a stale split or grid baked into
 * a replayed graph is off by far more); the sampled picks equal across the three cuda paths.
 * The decode-kernel paths must have run every decode step on it (eng_cuda_stats decode_steps),
 * the attn path none, and the default must have replayed graphs. Over llama (F16 weights, F16
 * KV) and qwen2 (F32 weights, q/k/v biases, F32 KV: the kernel's F32 loads). */
enum { DEC_NS = 4, DEC_GEN = 24, DEC_MIXED = 100 };
/* Logits rows of one run: the prompts', DEC_GEN decode steps', the mixed step's. */
#define DEC_OUT_ROWS ((size_t)(1 + DEC_GEN) * DEC_NS + DEC_NS + 1)
static int e2e_decode_run(eng_t *e, const int32_t *prompt, const int32_t *gen, float *out,
                          int32_t *picked)
{
    static const uint32_t lens[DEC_NS] = {3000, 1500, 701, 40};
    uint32_t V = eng_n_vocab(e);
    eng_seq_t *s[DEC_NS] = {0};
    eng_batch_item_t it[DEC_NS];
    int rc = 0;
    for (int i = 0; i < DEC_NS && rc == 0; i++) {
        if ((rc = eng_seq_create(e, &s[i])) != 0)
            break;
        it[i] = (eng_batch_item_t){
            .seq = s[i], .tokens = prompt + i, .n_tokens = lens[i], .logits = ENG_LOGITS_LAST};
        rc = eng_forward(e, &it[i], 1, out + (size_t)i * V);
    }
    for (int g = 0; g < DEC_GEN && rc == 0; g++) {
        for (int i = 0; i < DEC_NS; i++)
            it[i] = (eng_batch_item_t){.seq = s[i],
                                       .tokens = &gen[g * DEC_NS + i],
                                       .n_tokens = 1,
                                       .logits = ENG_LOGITS_LAST};
        rc = eng_forward(e, it, DEC_NS, out + (size_t)(g + 1) * DEC_NS * V);
    }
    eng_seq_t *extra = NULL;
    if (rc == 0 && (rc = eng_seq_create(e, &extra)) == 0) {
        eng_batch_item_t mixed[DEC_NS + 1];
        for (int i = 0; i < DEC_NS; i++)
            mixed[i] = (eng_batch_item_t){.seq = s[i],
                                          .tokens = &gen[(DEC_GEN - 1) * DEC_NS + i],
                                          .n_tokens = 1,
                                          .logits = ENG_LOGITS_LAST};
        mixed[DEC_NS] = (eng_batch_item_t){
            .seq = extra, .tokens = prompt, .n_tokens = DEC_MIXED, .logits = ENG_LOGITS_LAST};
        rc = eng_forward(e, mixed, DEC_NS + 1, out + (size_t)(1 + DEC_GEN) * DEC_NS * V);
    }
    if (extra != NULL)
        eng_seq_free(e, extra);
    if (rc == 0 && picked != NULL) {
        eng_sample_row_t rows[DEC_NS];
        for (int i = 0; i < DEC_NS; i++) {
            rows[i] = (eng_sample_row_t){
                .temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .u = 0.1 + 0.2 * i};
            it[i].tokens = &gen[i];
        }
        rc = eng_forward_sample(e, it, DEC_NS, rows, picked);
    }
    for (int i = 0; i < DEC_NS; i++)
        if (s[i] != NULL)
            eng_seq_free(e, s[i]);
    return rc;
}

static eng_t *e2e_decode_engine(const char *path, const char *backend, enum eng_kv_dtype kvt,
                                const char *decode, const char *graphs)
{
    if (decode != NULL)
        setenv("KVGW_CUDA_DECODE", decode, 1);
    setenv("KVGW_CUDA_GRAPHS", graphs, 1);
    eng_params_t p = eng_params_default();
    p.model_path = path;
    p.backend = backend;
    p.kv_dtype = kvt;
    p.kv_block_tokens = 8;
    p.kv_max_tokens = 8192;
    p.kv_poison = true;
    p.max_batch_tokens = 256;
    eng_t *e = NULL;
    char err[256];
    if (eng_init(&p, &e, err, sizeof err) != 0)
        fprintf(stderr, "eng_init(%s): %s\n", backend, err);
    unsetenv("KVGW_CUDA_DECODE");
    unsetenv("KVGW_CUDA_GRAPHS");
    return e;
}

PC_TEST(cuda_decode_kernel_long_contexts_match_cpu_and_attn_path)
{
    NEED_GPU();
    const struct {
        enum eng_arch arch;
        uint32_t dtype;
        enum eng_kv_dtype kv;
    } cases[] = {{ENG_ARCH_LLAMA, ENG_GGML_TYPE_F16, ENG_KV_F16},
                 {ENG_ARCH_QWEN2, ENG_GGML_TYPE_F32, ENG_KV_F32}};
    kt_rng_t r = {35};
    enum { NP = 3000 + DEC_NS };
    int32_t *prompt = malloc(sizeof *prompt * NP), gen[DEC_GEN * DEC_NS];
    for (int i = 0; i < NP; i++)
        prompt[i] = (int32_t)kt_below(&r, E2E_VOCAB);
    for (size_t i = 0; i < PC_ARRAY_LEN(gen); i++)
        gen[i] = (int32_t)kt_below(&r, E2E_VOCAB);
    /* 0 cpu, 1 cuda attn path (graphs), 2 decode kernel without graphs, 3 the default. */
    static const char *const names[4] = {"cpu", "attn", "kernel, no graphs", "kernel, graphs"};
    for (size_t ci = 0; ci < PC_ARRAY_LEN(cases); ci++) {
        char path[256];
        e2e_model_ex(cases[ci].arch, cases[ci].dtype, true, path, sizeof path);
        size_t n = DEC_OUT_ROWS * E2E_VOCAB;
        float *out[4];
        int32_t picked[4][DEC_NS];
        for (int k = 0; k < 4; k++) {
            out[k] = calloc(n, sizeof(float));
            eng_t *e = e2e_decode_engine(path, k == 0 ? "cpu" : "cuda", cases[ci].kv,
                                         k == 1 ? "attn" : NULL, k == 2 ? "0" : "1");
            ASSERT_TRUE(e != NULL);
            eng_cuda_stats_t st0, st1;
            eng_cuda_stats_get(&st0);
            ASSERT_EQ(e2e_decode_run(e, prompt, gen, out[k], k == 0 ? NULL : picked[k]), 0);
            eng_cuda_stats_get(&st1);
            char msg[256];
            ASSERT_EQ(eng_check(e, msg, sizeof msg), 0);
            eng_free(e);
            uint64_t dsteps = st1.decode_steps - st0.decode_steps;
            uint64_t replays = st1.graph_replays - st0.graph_replays;
            uint64_t failures = st1.graph_failures - st0.graph_failures;
            /* The steps with decode rows: DEC_GEN batched ones, the mixed one and the sampled
             * one (the prompts, of 40 tokens and more, are prefill steps). */
            if (k >= 2 && dsteps != DEC_GEN + 2)
                PC_TEST__FAIL("case %zu (%s): %llu of %d steps with decode rows ran the decode "
                              "kernel",
                              ci, names[k], (unsigned long long)dsteps, DEC_GEN + 2);
            if (k == 1 && dsteps != 0)
                PC_TEST__FAIL("case %zu: KVGW_CUDA_DECODE=attn still ran the decode kernel "
                              "(%llu steps)",
                              ci, (unsigned long long)dsteps);
            if (k == 3 && (failures != 0 || replays < DEC_GEN / 2))
                PC_TEST__FAIL("case %zu: %llu graph replays, %llu failed captures over %d decode "
                              "steps (the log says why a capture failed)",
                              ci, (unsigned long long)replays, (unsigned long long)failures,
                              DEC_GEN + 1);
        }
        double e_cpu[4] = {0}, e_attn = kt_rel_err_f(out[2], out[1], (int64_t)n),
               e_graph = kt_rel_err_f(out[3], out[2], (int64_t)n);
        for (int k = 1; k < 4; k++)
            e_cpu[k] = kt_rel_err_f(out[k], out[0], (int64_t)n);
        for (int k = 0; k < 4; k++)
            free(out[k]);
        unlink(path);
        if (!(e_cpu[1] <= 1e-2 && e_cpu[2] <= 1e-2 && e_cpu[3] <= 1e-2 && e_attn <= 1e-3 &&
              e_graph <= 1e-4))
            PC_TEST__FAIL("case %zu: against the cpu: attn %g, kernel %g, kernel+graphs %g "
                          "(<= 1e-2); kernel vs attn %g (<= 1e-3); graphs vs none %g (<= 1e-4)",
                          ci, e_cpu[1], e_cpu[2], e_cpu[3], e_attn, e_graph);
        for (int i = 0; i < DEC_NS; i++)
            if (picked[1][i] != picked[2][i] || picked[2][i] != picked[3][i])
                PC_TEST__FAIL("case %zu: sampled row %d picks %d (attn), %d (kernel), %d (kernel, "
                              "graphs)",
                              ci, i, picked[1][i], picked[2][i], picked[3][i]);
    }
    free(prompt);
}
