/*
 * engine.c — the engine core: model + KV pool + backend, sequences and batched forward steps
 * (see engine.h).
 *
 * Invariants: every live sequence is on the engine's list (so eng_check can count the
 * references they hold); a sequence's kv.n_tokens positions hold computed KV, and its table
 * may hold blocks past them only inside eng_forward.
 */
#include "engine.h"

#include <stdio.h>
#include <string.h>

#include "cpu.h"
#include "engine_internal.h"
#include "model.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pc_vec.h"
#include "quant.h"
#include "sampling.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

const char *eng_kv_dtype_name(enum eng_kv_dtype t)
{
    switch (t) {
    case ENG_KV_F16:
        return "f16";
    case ENG_KV_F32:
        return "f32";
    case ENG_KV_Q8_0:
        return "q8_0";
    }
    return "?";
}

int eng_kv_dtype_parse(const char *s, enum eng_kv_dtype *out)
{
    static const enum eng_kv_dtype all[] = {ENG_KV_F16, ENG_KV_F32, ENG_KV_Q8_0};
    for (size_t i = 0; s != NULL && i < PC_ARRAY_LEN(all); i++) {
        if (strcmp(s, eng_kv_dtype_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    return PC_ERR_INVAL;
}

eng_params_t eng_params_default(void)
{
    return (eng_params_t){.model_path = NULL,
                          .n_threads = 2,
                          .kv_dtype = ENG_KV_F16,
                          .kv_block_tokens = ENG_KV_BLOCK_TOKENS_DEFAULT,
                          .kv_max_tokens = 65536,
                          .kv_max_bytes = 0,
                          .max_batch_tokens = 512,
                          .weights_f32 = false,
                          .kv_poison = false,
                          .no_simd = false,
                          .gemm = ENG_GEMM_AUTO,
                          .backend = "cpu",
                          .cuda_device = 0,
                          .host_sampling = false,
                          .tier = {.dir = NULL,
                                   .max_bytes = 0,
                                   .key = NULL,
                                   .write_through = true,
                                   .min_tokens = 64,
                                   .g2_bytes = 0,
                                   .queue_bytes = 64ull << 20,
                                   .load_always = false,
                                   .io_threads = 8,
                                   .shutdown_ms = 3000,
                                   .shutdown_bytes = 0}};
}

/* Creates e->kv for the model: with host storage for the blocks, or (storage false) block
 * accounting only, for a backend that keeps KV in its own memory. Returns 0 or an error with
 * the reason in err. */
static int make_kvpool(eng_t *e, bool storage, char *err, size_t err_len)
{
    const eng_params_t *p = &e->p;
    const eng_hparams_t *hp = &e->model->hp;
    eng_kvpool_params_t kp = eng_kvpool_params_default();
    kp.block_tokens = p->kv_block_tokens;
    kp.dtype = p->kv_dtype;
    kp.max_tokens = p->kv_max_tokens;
    kp.max_bytes = p->kv_max_bytes;
    kp.poison = p->kv_poison;
    kp.no_storage = !storage;
    int rc = eng_kvpool_init(&kp, hp->n_layer, hp->n_head_kv, hp->head_dim, &e->kv);
    if (rc != 0)
        snprintf(err, err_len,
                 "engine: cannot create the KV pool (%s): block size %u, budget %llu "
                 "tokens / %llu bytes",
                 pc_strerror(rc), p->kv_block_tokens, (unsigned long long)p->kv_max_tokens,
                 (unsigned long long)p->kv_max_bytes);
    return rc;
}

/* Creates e->be as `backend` asks ("cpu", "cuda" or "auto": cuda where a device is usable,
 * else cpu). e->kv exists; it has no host storage when the backend may be cuda (the cuda
 * backend keeps KV on its device), and gets it back here when "auto" falls back to the CPU.
 * Returns 0 or an error with the reason in err. */
static int make_backend(eng_t *e, const char *backend, char *err, size_t err_len)
{
    const eng_params_t *p = &e->p;
    int rc;
#ifdef KVGW_HAVE_CUDA
    if (strcmp(backend, "cpu") != 0) {
        eng_cuda_params_t gp = {.device = p->cuda_device,
                                .max_tokens = p->max_batch_tokens,
                                .block_tokens = p->kv_block_tokens,
                                .split_kv = 0,
                                .kv_poison = p->kv_poison};
        char gerr[256] = "";
        rc = eng_backend_cuda_init(e->model, e->kv, &gp, &e->be, gerr, sizeof gerr);
        if (rc == 0)
            return 0;
        if (strcmp(backend, "cuda") == 0 || rc != PC_ERR_UNSUPPORTED) {
            snprintf(err, err_len, "engine: %s", gerr);
            return rc;
        }
        /* auto on a machine without a usable GPU: the CPU backend, which computes from the
         * pool's host memory, and the reason kept for the caller to print. Nothing references
         * the storage-less pool yet. */
        const char *why = strncmp(gerr, "cuda backend: ", 14) == 0 ? gerr + 14 : gerr;
        snprintf(e->backend_note, sizeof e->backend_note, "cuda unavailable: %.230s", why);
        PC_LOG(PC_LOG_WARN, "engine", "backend auto: using the CPU (%s)", e->backend_note);
        if (!eng_kvpool_has_storage(e->kv)) {
            eng_kvpool_free(e->kv);
            e->kv = NULL;
            if ((rc = make_kvpool(e, true, err, err_len)) != 0)
                return rc;
        }
    }
#else
    PC_ASSERT(strcmp(backend, "cuda") != 0); /* eng_init refused it */
    if (strcmp(backend, "auto") == 0)
        snprintf(e->backend_note, sizeof e->backend_note,
                 "cuda unavailable: this build has no CUDA support");
#endif
    eng_cpu_params_t cp = {.n_threads = p->n_threads,
                           .max_tokens = p->max_batch_tokens,
                           .block_tokens = p->kv_block_tokens,
                           .no_simd = p->no_simd,
                           .bf16 = e->p.gemm != ENG_GEMM_F32,
                           .bf16_skip_f32 = e->p.gemm == ENG_GEMM_AUTO,
                           .isa = e->cpu_isa};
    rc = eng_backend_cpu_init(e->model, &cp, &e->be);
    if (rc != 0)
        snprintf(err, err_len, "engine: cannot create the CPU backend: %s", pc_strerror(rc));
    return rc;
}

int eng_init(const eng_params_t *p, eng_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (err != NULL && err_len > 0)
        err[0] = '\0';
    if (p->model_path == NULL || p->n_threads == 0 || p->n_threads > 256 ||
        p->max_batch_tokens == 0 || p->max_batch_tokens > (1u << 20)) {
        snprintf(err, err_len, "engine: invalid parameters (model path, threads 1..256, batch)");
        return PC_ERR_INVAL;
    }
    if (p->kv_dtype != ENG_KV_F16 && p->kv_dtype != ENG_KV_F32 && p->kv_dtype != ENG_KV_Q8_0) {
        snprintf(err, err_len, "engine: invalid KV dtype %d (f16, f32 or q8_0)", (int)p->kv_dtype);
        return PC_ERR_INVAL;
    }
    if (p->gemm != ENG_GEMM_AUTO && p->gemm != ENG_GEMM_F32 && p->gemm != ENG_GEMM_BF16) {
        snprintf(err, err_len, "engine: invalid GEMM mode %d (auto, f32 or bf16)", (int)p->gemm);
        return PC_ERR_INVAL;
    }
    const char *backend = p->backend != NULL ? p->backend : "cpu";
    if (strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0 &&
        strcmp(backend, "auto") != 0) {
        snprintf(err, err_len, "engine: unknown backend \"%s\" (cpu, cuda or auto)", backend);
        return PC_ERR_INVAL;
    }
#ifndef KVGW_HAVE_CUDA
    if (strcmp(backend, "cuda") == 0) {
        snprintf(err, err_len,
                 "engine: backend \"cuda\" requested, but this build has no CUDA "
                 "support (rebuild with nvcc installed, -DKVGW_CUDA=ON)");
        return PC_ERR_UNSUPPORTED;
    }
#endif
    eng_t *e = pc_calloc(1, sizeof *e);
    if (e == NULL)
        return PC_ERR_NOMEM;
    e->p = *p;
    e->p.model_path = NULL; /* not kept: the caller's string */
    e->p.backend = NULL;    /* nor this one: the resolved name is eng_backend_name_of */
    e->p.cpu_isa = NULL;    /* nor this one: the resolved path is eng_cpu_isa_name_of */
    eng_cpu_isa_t isa = ENG_CPU_ISA_PORTABLE;
    if (!p->no_simd) {
        char ierr[160];
        int irc = eng__cpu_isa_resolve(p->cpu_isa, &isa, ierr, sizeof ierr);
        if (irc != 0) {
            snprintf(err, err_len, "engine: %s", ierr);
            pc_free(e);
            return irc;
        }
    }
    e->cpu_isa = isa;
    e->model_path = pc_strdup(p->model_path);
    if (e->model_path == NULL) {
        pc_free(e);
        return PC_ERR_NOMEM;
    }
    eng_model_params_t mp = eng_model_params_default();
    mp.weights_f32 = p->weights_f32;
    mp.copy_weights = strcmp(backend, "cuda") != 0; /* host copies help only the CPU backend */
    mp.progress = p->load_progress;
    mp.progress_ud = p->load_progress_ud;
    int rc = eng_model_load(p->model_path, &mp, &e->model, err, err_len);
    if (rc != 0)
        goto fail;
    if (p->kv_dtype == ENG_KV_Q8_0 && e->model->hp.head_dim % ENG_QK8_0 != 0) {
        snprintf(err, err_len,
                 "engine: KV dtype q8_0 needs a head size that is a multiple of 32 (this model's "
                 "is %u); use f16 or f32",
                 e->model->hp.head_dim);
        rc = PC_ERR_UNSUPPORTED;
        goto fail;
    }
    /* Host KV memory only for the CPU backend: a cuda backend's pool lives on its device. */
    bool kv_storage = true;
#ifdef KVGW_HAVE_CUDA
    kv_storage = strcmp(backend, "cpu") == 0;
#endif
    rc = make_kvpool(e, kv_storage, err, err_len);
    if (rc != 0)
        goto fail;
    rc = make_backend(e, backend, err, err_len);
    if (rc != 0)
        goto fail;
    if (!e->be->iface->supports(e->be, ENG_BACKEND_OP_KV, (uint32_t)p->kv_dtype)) {
        snprintf(err, err_len, "engine: the %s backend does not support KV dtype %s",
                 eng_backend_name(e->be), eng_kv_dtype_name(p->kv_dtype));
        rc = PC_ERR_UNSUPPORTED;
        goto fail;
    }
    e->blk_mark = pc_calloc(eng_kvpool_n_blocks(e->kv), 1);
    if (e->blk_mark == NULL) {
        rc = PC_ERR_NOMEM;
        snprintf(err, err_len, "engine: out of memory");
        goto fail;
    }
    rc = eng__prefix_init(e, &e->prefix);
    if (rc != 0) {
        snprintf(err, err_len, "engine: cannot create the prefix index: %s", pc_strerror(rc));
        goto fail;
    }
    e->model_size = eng_gguf_file_size(e->model->_gguf);
    if (p->tier.g2_bytes > 0 && (p->tier.dir == NULL || p->tier.dir[0] == '\0')) {
        rc = PC_ERR_INVAL;
        snprintf(err, err_len,
                 "engine: the host-memory KV tier (g2_bytes) needs the disk tier's "
                 "directory (the tiers are off without it)");
        goto fail;
    }
    if (p->tier.dir != NULL && p->tier.dir[0] != '\0') {
        uint64_t fp;
        rc = eng_model_fingerprint(e, &fp, err, err_len);
        if (rc == 0)
            rc = eng__tier_init(e, &p->tier, &e->tier, err, err_len);
        if (rc != 0)
            goto fail;
    }
    e->p.tier.dir = NULL; /* not kept: the caller's string and key (the store copied them) */
    e->p.tier.key = NULL;
    *out = e;
    return 0;

fail:
    eng_free(e);
    return rc;
}

void eng_free(eng_t *e)
{
    if (e == NULL)
        return;
    PC_ASSERT(e->seqs == NULL);
    /* Orderly shutdown: what the pool caches goes to the disk tier (bounded; tier.h). */
    eng__prefix_shutdown(e);
    /* The index goes first (its cached blocks are released before the pool, and it reports no
     * write-back to a freed tier: destroying the tree evicts nothing); the tiers then finish
     * their queued writes. */
    eng__prefix_free(e->prefix);
    eng__tier_free(e->tier);
    eng_backend_free(e->be);
    eng_kvpool_free(e->kv);
    eng_model_free(e->model);
    pc_free(e->fwd);
    pc_free(e->fwd_item);
    pc_free(e->orig_tokens);
    pc_free(e->blk_mark);
    pc_free(e->model_path);
    pc_free(e);
}

/* XXH3-64 of the whole file, tensor data included. One streaming pass with read() through a
 * small buffer, not through the engine's mapping: the loader copied the weights and dropped
 * their mapped pages, and touching them again would keep the whole file resident in the
 * process (page cache reads do not count). A file whose size changed since it was loaded is an
 * error. */
int eng_model_fingerprint(eng_t *e, uint64_t *out, char *err, size_t err_len)
{
    if (e->has_fp) {
        *out = e->model_fp;
        return 0;
    }
    enum { CHUNK = 1 << 20 };
    int rc = 0;
    uint64_t t0 = pc_time_mono_ns();
    char *buf = pc_malloc(CHUNK);
    FILE *f = fopen(e->model_path, "rb");
    if (buf == NULL || f == NULL) {
        rc = buf == NULL ? PC_ERR_NOMEM : PC_ERR_IO;
        snprintf(err, err_len, "engine: fingerprinting %s: %s", e->model_path,
                 buf == NULL ? "out of memory" : "cannot open the file");
        goto done;
    }
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    uint64_t total = 0;
    size_t n;
    while ((n = fread(buf, 1, CHUNK, f)) > 0) {
        XXH3_64bits_update(&st, buf, n);
        total += n;
    }
    if (ferror(f) || total != e->model_size) {
        rc = PC_ERR_IO;
        snprintf(err, err_len, "engine: fingerprinting %s: %s", e->model_path,
                 ferror(f) ? "read error" : "the file changed while loading");
        goto done;
    }
    e->model_fp = XXH3_64bits_digest(&st);
    e->has_fp = true;
    *out = e->model_fp;
    PC_LOG(PC_LOG_INFO, "engine", "model fingerprint %016llx: XXH3 of %.1f MiB in %.0f ms",
           (unsigned long long)e->model_fp, (double)total / (1 << 20),
           (double)(pc_time_mono_ns() - t0) / 1e6);
done:
    if (f != NULL)
        fclose(f);
    pc_free(buf);
    return rc;
}

const eng_hparams_t *eng_hparams(const eng_t *e)
{
    return &e->model->hp;
}
uint32_t eng_n_vocab(const eng_t *e)
{
    return e->model->hp.n_vocab;
}
const eng_gguf_t *eng_model_gguf(const eng_t *e)
{
    return e->model->_gguf;
}
static double weight_bytes(const eng_weight_t *w)
{
    return (double)eng_quant_row_bytes(w->type, w->n_in) * w->n_out;
}

double eng_decode_weight_bytes(const eng_t *e)
{
    const eng_model_t *m = e->model;
    double b = weight_bytes(&m->output);
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const eng_layer_t *y = &m->layers[l];
        b += weight_bytes(&y->wq) + weight_bytes(&y->wk) + weight_bytes(&y->wv) +
             weight_bytes(&y->wo) + weight_bytes(&y->w_gate) + weight_bytes(&y->w_up) +
             weight_bytes(&y->w_down);
    }
    return b;
}
eng_kvpool_t *eng_kvpool(eng_t *e)
{
    return e->kv;
}

void eng_kv_stats(eng_t *e, eng_kv_stats_t *out)
{
    uint32_t n_blocks = eng_kvpool_n_blocks(e->kv);
    memset(e->blk_mark, 0, n_blocks);
    for (const eng_seq_t *s = e->seqs; s != NULL; s = s->next)
        for (uint32_t i = 0; i < s->kv.n_blocks; i++)
            e->blk_mark[s->kv.blocks[i]] = 1;
    uint32_t n_cached = 0;
    for (uint32_t b = 0; b < n_blocks; b++)
        n_cached += e->blk_mark[b] == 0 && eng_kvpool_refcount(e->kv, b) > 0;
    *out = (eng_kv_stats_t){.block_tokens = eng_kvpool_block_tokens(e->kv),
                            .n_blocks = n_blocks,
                            .n_free = eng_kvpool_n_free(e->kv),
                            .n_cached = n_cached,
                            .block_bytes = eng_kvpool_block_bytes(e->kv),
                            .dtype = eng_kvpool_dtype(e->kv),
                            .bytes_per_token =
                                eng_kvpool_block_bytes(e->kv) / eng_kvpool_block_tokens(e->kv),
                            .capacity_tokens = (uint64_t)n_blocks * eng_kvpool_block_tokens(e->kv)};
}
const char *eng_backend_name_of(const eng_t *e)
{
    return eng_backend_name(e->be);
}

const char *eng_backend_note_of(const eng_t *e)
{
    return e->backend_note;
}

int eng_gemm_mode_parse(const char *s, enum eng_gemm_mode *out)
{
    static const struct {
        const char *name;
        enum eng_gemm_mode mode;
    } modes[] = {{"auto", ENG_GEMM_AUTO}, {"f32", ENG_GEMM_F32}, {"bf16", ENG_GEMM_BF16}};
    for (size_t i = 0; i < PC_ARRAY_LEN(modes); i++) {
        if (strcmp(s, modes[i].name) == 0) {
            *out = modes[i].mode;
            return 0;
        }
    }
    return PC_ERR_INVAL;
}

const char *eng_cpu_isa_name_of(const eng_t *e)
{
    if (strcmp(eng_backend_name(e->be), "cpu") != 0)
        return "none";
    return eng__cpu_isa_name((eng_cpu_isa_t)e->cpu_isa);
}

const char *eng_cpu_isa_best_name(void)
{
    return eng__cpu_isa_name(eng__cpu_isa_best());
}

const char *eng_gemm_name_of(const eng_t *e)
{
    return strcmp(eng_backend_name(e->be), "cpu") == 0 && eng_backend_cpu_gemm_bf16(e->be) ? "bf16"
                                                                                           : "f32";
}

int eng_seq_create(eng_t *e, eng_seq_t **out)
{
    eng_seq_t *s = pc_calloc(1, sizeof *s);
    if (s == NULL)
        return PC_ERR_NOMEM;
    eng_kvseq_init(&s->kv);
    s->next = e->seqs;
    if (e->seqs != NULL)
        e->seqs->prev = s;
    e->seqs = s;
    e->n_seqs++;
    *out = s;
    return 0;
}

void eng_seq_free(eng_t *e, eng_seq_t *s)
{
    if (s == NULL)
        return;
    eng_kvseq_close(&s->kv, e->kv);
    pc_free(s->tokens);
    if (s->prev != NULL)
        s->prev->next = s->next;
    else
        e->seqs = s->next;
    if (s->next != NULL)
        s->next->prev = s->prev;
    e->n_seqs--;
    pc_free(s);
}

void eng_seq_origin(const eng_seq_t *s, eng_seq_origin_t *out)
{
    *out = s->origin;
}

uint32_t eng_seq_n_tokens(const eng_seq_t *s)
{
    return s->kv.n_tokens;
}

const int32_t *eng_seq_tokens(const eng_seq_t *s)
{
    return s->tokens;
}

int eng__seq_tokens_reserve(eng_seq_t *s, uint32_t n)
{
    return pc_array_reserve(&s->tokens, &s->tokens_cap, n);
}

uint32_t eng_batch_n_rows(const eng_batch_item_t *items, uint32_t n_items)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < n_items; i++)
        n += items[i].logits == ENG_LOGITS_ALL    ? items[i].n_tokens
             : items[i].logits == ENG_LOGITS_LAST ? 1
                                                  : 0;
    return n;
}

/* eng_forward (logits != NULL or no row asked for) and eng_forward_sample (srows and tokens
 * != NULL, the backend has forward_sample): the same steps, each writing its rows' logits or
 * tokens at the rows done so far. */
static int forward_steps(eng_t *e, const eng_batch_item_t *items, uint32_t n_items, float *logits,
                         const struct eng_sample_row *srows, int32_t *tokens)
{
    const eng_hparams_t *hp = &e->model->hp;
    if (n_items == 0)
        return PC_ERR_INVAL;
    /* Validate everything before touching any state. */
    e->mark++;
    for (uint32_t i = 0; i < n_items; i++) {
        const eng_batch_item_t *it = &items[i];
        if (it->seq == NULL || it->tokens == NULL || it->n_tokens == 0 ||
            it->seq->mark == e->mark || it->logits > ENG_LOGITS_ALL)
            return PC_ERR_INVAL;
        if ((uint64_t)it->seq->kv.n_tokens + it->n_tokens > hp->n_ctx_train)
            return PC_ERR_INVAL;
        it->seq->mark = e->mark;
        for (uint32_t j = 0; j < it->n_tokens; j++)
            if (it->tokens[j] < 0 || (uint32_t)it->tokens[j] >= hp->n_vocab)
                return PC_ERR_INVAL;
    }
    if (eng_batch_n_rows(items, n_items) > 0 && logits == NULL && tokens == NULL)
        return PC_ERR_INVAL;

    /* Reserve every item's blocks; on failure release what this call reserved. */
    uint32_t n_res = 0;
    int rc = 0;
    for (; n_res < n_items; n_res++) {
        eng_seq_t *sq = items[n_res].seq;
        rc = eng__seq_tokens_reserve(sq, sq->kv.n_tokens + items[n_res].n_tokens);
        if (rc != 0)
            break;
        rc = eng_kvseq_reserve(&sq->kv, e->kv, items[n_res].n_tokens);
        if (rc != 0)
            break;
    }
    if (rc != 0) {
        for (uint32_t i = 0; i < n_res; i++)
            eng_kvseq_trim(&items[i].seq->kv, e->kv);
        return rc == PC_ERR_NOSPACE ? 1 : rc;
    }

    if (e->fwd_cap < n_items) {
        eng_fwd_seq_t *f = pc_reallocarray(e->fwd, n_items, sizeof *f);
        if (f != NULL)
            e->fwd = f;
        uint32_t *fi = pc_reallocarray(e->fwd_item, n_items, sizeof *fi);
        if (fi != NULL)
            e->fwd_item = fi;
        uint32_t *o = pc_reallocarray(e->orig_tokens, n_items, sizeof *o);
        if (o != NULL)
            e->orig_tokens = o;
        if (f == NULL || fi == NULL || o == NULL) {
            rc = PC_ERR_NOMEM;
            goto fail;
        }
        e->fwd_cap = n_items;
    }
    for (uint32_t i = 0; i < n_items; i++)
        e->orig_tokens[i] = items[i].seq->kv.n_tokens;

    /* Steps of at most max_batch_tokens tokens; an item may span several steps, and each
     * sequence appears at most once per step. */
    uint32_t item = 0, done = 0; /* next token: items[item].tokens[done] */
    uint32_t n_vocab = hp->n_vocab;
    size_t row_out = 0;
    while (item < n_items) {
        uint32_t budget = e->p.max_batch_tokens, n = 0, rows = 0;
        while (item < n_items && budget > 0) {
            const eng_batch_item_t *it = &items[item];
            uint32_t take = PC_MIN(budget, it->n_tokens - done);
            bool ends = done + take == it->n_tokens;
            enum eng_logits_mode lm = it->logits == ENG_LOGITS_ALL              ? ENG_LOGITS_ALL
                                      : (it->logits == ENG_LOGITS_LAST && ends) ? ENG_LOGITS_LAST
                                                                                : ENG_LOGITS_NONE;
            e->fwd_item[n] = item;
            e->fwd[n++] = (eng_fwd_seq_t){.tokens = it->tokens + done,
                                          .n_tokens = take,
                                          .pos0 = it->seq->kv.n_tokens,
                                          .blocks = it->seq->kv.blocks,
                                          .n_blocks = it->seq->kv.n_blocks,
                                          .logits = lm};
            rows += lm == ENG_LOGITS_ALL ? take : lm == ENG_LOGITS_LAST;
            budget -= take;
            done += take;
            if (ends) {
                item++;
                done = 0;
            } else {
                break; /* the budget is spent */
            }
        }
        uint32_t step_tokens = e->p.max_batch_tokens - budget;
        uint64_t t_step = pc_time_mono_ns();
        if (tokens != NULL)
            rc = e->be->iface->forward_sample(e->be, e->model, e->kv, e->fwd, n, srows + row_out,
                                              tokens + row_out);
        else
            rc = e->be->iface->forward(e->be, e->model, e->kv, e->fwd, n,
                                       rows ? logits + row_out * n_vocab : NULL);
        if (rc != 0)
            goto fail;
        /* The tiers' cost model weighs loads against this rate (prefill-sized steps only:
         * decode steps measure something else). */
        if (step_tokens >= 64) {
            double dt = (double)(pc_time_mono_ns() - t_step) / 1e9;
            double tps = dt > 0 ? step_tokens / dt : 0;
            double pos_sum = 0;
            for (uint32_t i = 0; i < n; i++)
                pos_sum += (double)e->fwd[i].n_tokens *
                           ((double)e->fwd[i].pos0 + (double)e->fwd[i].n_tokens / 2);
            double pos = pos_sum / step_tokens;
            if (tps > 0) {
                bool first = e->prefill_tps <= 0;
                e->prefill_tps = first ? tps : 0.8 * e->prefill_tps + 0.2 * tps;
                e->prefill_pos = first ? pos : 0.8 * e->prefill_pos + 0.2 * pos;
            }
        }
        row_out += rows;
        for (uint32_t i = 0; i < n; i++) { /* commit: these positions now hold KV */
            eng_seq_t *sq = items[e->fwd_item[i]].seq;
            memcpy(sq->tokens + sq->kv.n_tokens, e->fwd[i].tokens,
                   e->fwd[i].n_tokens * sizeof *sq->tokens);
            sq->kv.n_tokens += e->fwd[i].n_tokens;
        }
    }
    return 0;

fail:
    /* A failed step leaves every sequence as it was before this call. */
    for (uint32_t i = 0; i < n_items; i++) {
        if (e->orig_tokens != NULL && e->fwd_cap >= n_items)
            items[i].seq->kv.n_tokens = e->orig_tokens[i];
        eng_kvseq_trim(&items[i].seq->kv, e->kv);
    }
    return rc;
}

int eng_forward(eng_t *e, const eng_batch_item_t *items, uint32_t n_items, float *logits)
{
    return forward_steps(e, items, n_items, logits, NULL, NULL);
}

bool eng_samples_on_device(const eng_t *e)
{
    return e->be->iface->forward_sample != NULL && !e->p.host_sampling;
}

int eng_forward_sample(eng_t *e, const eng_batch_item_t *items, uint32_t n_items,
                       const struct eng_sample_row *rows, int32_t *tokens)
{
    if (!eng_samples_on_device(e))
        return PC_ERR_UNSUPPORTED;
    if (rows == NULL || tokens == NULL)
        return PC_ERR_INVAL;
    return forward_steps(e, items, n_items, NULL, rows, tokens);
}

int eng_check(eng_t *e, char *err, size_t err_len)
{
    uint32_t n = eng_kvpool_n_blocks(e->kv);
    uint32_t *refs = pc_calloc(n, sizeof *refs);
    if (refs == NULL)
        return PC_ERR_NOMEM;
    int rc = 0;
    for (eng_seq_t *s = e->seqs; s != NULL; s = s->next) {
        uint32_t need =
            (s->kv.n_tokens + eng_kvpool_block_tokens(e->kv) - 1) / eng_kvpool_block_tokens(e->kv);
        if (s->kv.n_blocks != need) {
            snprintf(err, err_len, "engine: a sequence of %u tokens holds %u blocks",
                     s->kv.n_tokens, s->kv.n_blocks);
            rc = PC_ERR_INTERNAL;
            goto done;
        }
        for (uint32_t i = 0; i < s->kv.n_blocks; i++)
            refs[s->kv.blocks[i]]++;
    }
    eng__prefix_count_refs(e->prefix, refs);
    rc = eng_kvpool_check(e->kv, refs, err, err_len);
    if (rc == 0)
        rc = eng__prefix_check(e->prefix, err, err_len);
done:
    pc_free(refs);
    return rc;
}
