/*
 * pool.c — in-process and remote workers behind one interface (pool.h).
 *
 * In-process: each eng_worker wakes the loop through its own uv_async_t; the callback drains
 * eng_worker_poll and hands every event to on_event. Remote: an lnk_worker_client per worker,
 * reconnected with exponential backoff (250 ms .. 5 s) after any close while the pool lives.
 * A host name is resolved again at every attempt (link/worker_client.h). A worker that cannot
 * be reached is logged at its first failed attempt, then at most once per FAIL_LOG_MS with the
 * count of failures in between, so a name that never resolves does not flood the log.
 */
#include "pool.h"

#include <stdio.h>
#include <string.h>

#include "common.h"
#include "pc_time.h"
#include "worker.h"
#include "worker_client.h"

#define POLL_BATCH 64
#define BACKOFF_MIN_MS 250
#define BACKOFF_MAX_MS 5000
#define FAIL_LOG_MS 60000

typedef struct slot {
    gw_pool_worker_t info;
    gw_pool_t *pool;
    /* in-process */
    eng_worker_t *w;
    uv_async_t wake;
    bool wake_live;
    /* remote */
    const char *address;
    lnk_worker_client_t *client;
    uv_timer_t retry;
    bool retry_live;
    uint32_t backoff_ms;
    uint64_t fail_logged_ms; /* when a failed attempt was last logged; 0: never since up */
    uint32_t fails_unlogged; /* failed attempts since then */
} slot_t;

struct gw_pool {
    uv_loop_t *loop;
    const gw_config_t *cfg;
    gw_pool_cbs_t cbs;
    void *ud;
    slot_t *slots;
    size_t n;
    bool closing;
    size_t handles_open;
    void (*done)(void *);
    void *done_ud;
    uv_thread_t reaper;
    bool reaper_live;
};

/* A LOAD report: the router's inputs. */
static void take_load(slot_t *s, const eng_wire_load_t *l)
{
    s->info.load = *l;
    s->info.submitted_prefill_tokens = 0; /* the worker's queue counts them now */
    if (l->total_blocks)
        s->info.total_blocks = l->total_blocks;
    if (l->prefill_tokens_per_s > 0)
        s->info.prefill_tok_s = l->prefill_tokens_per_s;
    if (l->decode_ms_per_token > 0)
        s->info.decode_ms_per_token = l->decode_ms_per_token;
    const eng_wire_tier_load_t *t = l->g3.blocks > 0 ? &l->g3 : &l->g2;
    if (t->blocks > 0 && s->info.block_tokens > 0)
        s->info.kv_bytes_per_token = (double)t->bytes / t->blocks / s->info.block_tokens;
}

static void worker_wake(void *ud)
{
    uv_async_send(ud);
}

static void drain_local(uv_async_t *a)
{
    slot_t *s = a->data;
    eng_worker_event_t ev[POLL_BATCH];
    for (;;) {
        size_t k = eng_worker_poll(s->w, ev, POLL_BATCH);
        for (size_t i = 0; i < k; i++) {
            if (ev[i].type == ENG_WIRE_LOAD)
                take_load(s, &ev[i].u.load);
            if (!s->pool->closing)
                s->pool->cbs.on_event(s->pool->ud, s->info.index, &ev[i]);
        }
        if (k < POLL_BATCH)
            break;
    }
}

static void connect_remote(slot_t *s);

static void retry_fire(uv_timer_t *t)
{
    slot_t *s = t->data;
    if (!s->pool->closing)
        connect_remote(s);
}

static void cl_ready(lnk_worker_client_t *c, const eng_wire_hello_t *ack, void *ud)
{
    slot_t *s = ud;
    s->backoff_ms = BACKOFF_MIN_MS;
    s->info.up = true;
    s->info.block_tokens = ack->block_tokens;
    s->info.n_ctx = ack->n_ctx;
    s->info.model_fp = ack->model_fp;
    s->info.total_blocks = ack->total_blocks;
    s->info.max_prompt_tokens = ack->max_prompt_tokens ? ack->max_prompt_tokens : ack->n_ctx;
    s->info.last_error[0] = '\0';
    snprintf(s->info.address, sizeof s->info.address, "%s", lnk_worker_client_peer(c));
    snprintf(s->info.node, sizeof s->info.node, "%.*s", (int)ack->node.len, ack->node.base);
    s->fail_logged_ms = 0;
    s->fails_unlogged = 0;
    PC_LOG(PC_LOG_INFO, "pool", "worker %s up at %s (%.*s, %u-token blocks)", s->info.name,
           s->info.address, (int)ack->model_name.len, ack->model_name.base, ack->block_tokens);
    s->pool->cbs.on_state(s->pool->ud, s->info.index, true, "connected");
    (void)c;
}

static void cl_frame(lnk_worker_client_t *c, const eng_wire_frame_t *f, void *ud)
{
    slot_t *s = ud;
    (void)c;
    if (f->type == ENG_WIRE_HEARTBEAT)
        return;
    if (f->type == ENG_WIRE_LOAD)
        take_load(s, &f->u.load);
    if (!s->pool->closing)
        s->pool->cbs.on_event(s->pool->ud, s->info.index, f);
}

static void cl_close(lnk_worker_client_t *c, int err, const char *reason, void *ud)
{
    slot_t *s = ud;
    (void)c;
    s->client = NULL;
    bool was_up = s->info.up;
    s->info.up = false;
    s->info.address[0] = '\0';
    s->info.down_since_ms = pc_time_mono_ms();
    snprintf(s->info.last_error, sizeof s->info.last_error, "%s",
             reason && reason[0] ? reason : pc_strerror(err));
    gw_pool_t *p = s->pool;
    if (p->closing) {
        if (--p->handles_open == 0 && p->done)
            p->done(p->done_ud);
        return;
    }
    uint64_t now = pc_time_mono_ms();
    if (was_up) {
        PC_LOG(PC_LOG_WARN, "pool", "worker %s down: %s", s->info.name, s->info.last_error);
    } else if (s->fail_logged_ms == 0 || now - s->fail_logged_ms >= FAIL_LOG_MS) {
        if (s->fails_unlogged > 0)
            PC_LOG(PC_LOG_WARN, "pool", "worker %s unreachable: %s (%u more failed attempts)",
                   s->info.name, s->info.last_error, s->fails_unlogged);
        else
            PC_LOG(PC_LOG_WARN, "pool", "worker %s unreachable: %s (retrying)", s->info.name,
                   s->info.last_error);
        s->fail_logged_ms = now;
        s->fails_unlogged = 0;
    } else {
        s->fails_unlogged++;
    }
    p->cbs.on_state(p->ud, s->info.index, false, s->info.last_error);
    p->handles_open--;
    uv_timer_start(&s->retry, retry_fire, s->backoff_ms, 0);
    s->backoff_ms = s->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : s->backoff_ms * 2;
}

static const lnk_worker_client_cbs_t client_cbs = {cl_ready, cl_frame, cl_close};

static void connect_remote(slot_t *s)
{
    gw_pool_t *p = s->pool;
    lnk_worker_client_params_t cp = lnk_worker_client_params_default();
    cp.address = s->address;
    cp.node = "kvgw-gateway";
    cp.model_name = p->cfg->models[s->info.model].name;
    cp.heartbeat_ms = p->cfg->worker_heartbeat_ms;
    cp.connect_timeout_ms = p->cfg->worker_connect_timeout_ms;
    if (p->cfg->link_secret != NULL) {
        cp.secret = (const uint8_t *)p->cfg->link_secret;
        cp.secret_len = strlen(p->cfg->link_secret);
    }
    char err[256];
    int rc = lnk_worker_client_connect(p->loop, &cp, &client_cbs, s, &s->client, err, sizeof err);
    if (rc != 0) {
        snprintf(s->info.last_error, sizeof s->info.last_error, "%s", err);
        s->client = NULL;
        uv_timer_start(&s->retry, retry_fire, s->backoff_ms, 0);
        return;
    }
    p->handles_open++;
}

/* worker: the in-process worker's index within its model (its KV tier directory). */
static int start_local(gw_pool_t *p, slot_t *s, const gw_cfg_model_t *m, uint32_t worker, char *err,
                       size_t err_len)
{
    eng_worker_params_t wp = eng_worker_params_default();
    const gw_cfg_tiers_t *t = &p->cfg->kv_tiers;
    char tier_dir[4096];
    if (t->dir != NULL) {
        if (gw_config_tier_dir(p->cfg, m, worker, tier_dir, sizeof tier_dir) != 0)
            return pc_err_setf(err, err_len, PC_ERR_RANGE, "kv_tiers.dir: %s is too long", t->dir);
        wp.engine.tier.dir = tier_dir;
        wp.engine.tier.max_bytes = t->max_bytes;
        wp.engine.tier.g2_bytes = t->g2_bytes;
        wp.engine.tier.write_through = t->write_through;
        wp.engine.tier.min_tokens = t->min_tokens;
        wp.engine.tier.key = t->has_key ? t->key : NULL;
    }
    wp.engine.model_path = m->path;
    wp.engine.n_threads = m->threads;
    wp.engine.backend = m->backend;
    wp.engine.kv_dtype = (enum eng_kv_dtype)m->kv_dtype;
    if (m->kv_bytes) {
        wp.engine.kv_max_bytes = m->kv_bytes;
        wp.engine.kv_max_tokens = 0;
    }
    wp.engine.load_progress = p->cbs.on_load;
    wp.engine.load_progress_ud = p->cbs.on_load_ud;
    wp.wake = worker_wake;
    wp.wake_ud = &s->wake;
    if (uv_async_init(p->loop, &s->wake, drain_local) != 0)
        return pc_err_setf(err, err_len, PC_ERR_INTERNAL, "uv_async_init failed");
    s->wake.data = s;
    s->wake_live = true;
    p->handles_open++;
    int rc = eng_worker_init(&wp, &s->w, err, err_len);
    if (p->cbs.on_load != NULL)
        p->cbs.on_load(0, 0, p->cbs.on_load_ud); /* the load is over */
    if (rc != 0)
        return rc;
    eng_worker_info_t in;
    eng_worker_info(s->w, &in);
    s->info.up = true;
    s->info.block_tokens = in.block_tokens;
    s->info.total_blocks = in.total_blocks;
    s->info.max_prompt_tokens = in.max_prompt_tokens;
    s->info.n_ctx = in.n_ctx;
    s->info.model_fp = in.model_fp;
    snprintf(s->info.kv_dtype, sizeof s->info.kv_dtype, "%s", in.kv_dtype);
    eng_worker_load(s->w, &s->info.load);
    return 0;
}

int gw_pool_init(uv_loop_t *loop, const gw_config_t *cfg, const gw_pool_cbs_t *cbs, void *ud,
                 gw_pool_t **out, char *err, size_t err_len)
{
    size_t n = 0;
    for (size_t i = 0; i < cfg->n_models; i++)
        n += cfg->models[i].in_process + cfg->models[i].n_remote;
    if (n == 0 || n > GW_POOL_MAX_WORKERS)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "between 1 and %d workers needed, %zu configured", GW_POOL_MAX_WORKERS,
                           n);
    gw_pool_t *p = pc_calloc(1, sizeof *p);
    slot_t *slots = pc_calloc(n, sizeof *slots);
    if (p == NULL || slots == NULL) {
        pc_free(p);
        pc_free(slots);
        return pc_err_setf(err, err_len, PC_ERR_NOMEM, "out of memory");
    }
    p->loop = loop;
    p->cfg = cfg;
    p->cbs = *cbs;
    p->ud = ud;
    p->slots = slots;
    p->n = n;
    size_t k = 0;
    int rc = 0;
    for (size_t mi = 0; mi < cfg->n_models && rc == 0; mi++) {
        const gw_cfg_model_t *m = &cfg->models[mi];
        for (uint32_t j = 0; j < m->in_process + m->n_remote && rc == 0; j++, k++) {
            slot_t *s = &slots[k];
            s->pool = p;
            s->info.index = (uint32_t)k;
            s->info.model = (uint32_t)mi;
            s->backoff_ms = BACKOFF_MIN_MS;
            uv_timer_init(loop, &s->retry);
            s->retry.data = s;
            s->retry_live = true;
            p->handles_open++;
            if (j < m->in_process) {
                snprintf(s->info.name, sizeof s->info.name, "local-%zu", k);
                fprintf(stderr, "kvgw: loading %s into worker %s ...\n", m->path, s->info.name);
                rc = start_local(p, s, m, j, err, err_len);
            } else {
                s->info.remote = true;
                s->address = m->remote[j - m->in_process];
                snprintf(s->info.name, sizeof s->info.name, "%s", s->address);
                connect_remote(s);
            }
        }
    }
    if (rc != 0) {
        /* Close what was opened; the loop runs the close callbacks. */
        gw_pool_shutdown(p, NULL, NULL);
        uv_run(loop, UV_RUN_NOWAIT);
        return rc;
    }
    *out = p;
    return 0;
}

size_t gw_pool_n_workers(const gw_pool_t *p)
{
    return p->n;
}

const gw_pool_worker_t *gw_pool_worker(const gw_pool_t *p, uint32_t i)
{
    return i < p->n ? &p->slots[i].info : NULL;
}

bool gw_pool_model_up(const gw_pool_t *p, uint32_t model)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->slots[i].info.model == model && p->slots[i].info.up)
            return true;
    return false;
}

int gw_pool_submit(gw_pool_t *p, uint32_t i, const eng_wire_submit_t *rq, uint32_t prefill_tokens,
                   char *err, size_t err_len)
{
    slot_t *s = &p->slots[i];
    if (!s->info.up || p->closing)
        return pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "worker %s is down", s->info.name);
    if (s->w != NULL) {
        int rc = eng_worker_submit(s->w, rq, err, err_len);
        if (rc == 0)
            eng_worker_load(s->w, &s->info.load);
        return rc;
    }
    int rc = lnk_worker_client_submit(s->client, rq);
    if (rc == 0)
        s->info.submitted_prefill_tokens += prefill_tokens;
    if (rc != 0)
        pc_err_setf(err, err_len, rc == PC_ERR_STATE ? PC_ERR_UPSTREAM : rc,
                    "worker %s: submit failed: %s", s->info.name, pc_strerror(rc));
    return rc == PC_ERR_STATE ? PC_ERR_UPSTREAM : rc;
}

int gw_pool_cancel(gw_pool_t *p, uint32_t i, uint64_t request_id)
{
    slot_t *s = &p->slots[i];
    if (s->w != NULL)
        return eng_worker_cancel(s->w, request_id);
    if (s->client == NULL || !s->info.up)
        return PC_ERR_UPSTREAM;
    return lnk_worker_client_cancel(s->client, request_id);
}

int gw_pool_release(gw_pool_t *p, uint32_t i, uint64_t ns, const uint32_t *tokens, uint32_t n)
{
    slot_t *s = &p->slots[i];
    if (s->w != NULL)
        return eng_worker_release(s->w, ns, tokens, n);
    if (s->client == NULL || !s->info.up)
        return PC_ERR_UPSTREAM;
    return lnk_worker_client_release(s->client, ns, tokens, n);
}

int gw_pool_drop_ns(gw_pool_t *p, uint32_t i, uint64_t ns)
{
    slot_t *s = &p->slots[i];
    if (s->w != NULL)
        return eng_worker_drop_ns(s->w, ns);
    if (s->client == NULL || !s->info.up)
        return PC_ERR_UPSTREAM;
    return lnk_worker_client_drop(s->client, ns);
}

static void handle_closed(uv_handle_t *h)
{
    gw_pool_t *p = h->data ? ((slot_t *)h->data)->pool : NULL;
    if (p != NULL && --p->handles_open == 0 && p->done)
        p->done(p->done_ud);
}

void gw_pool_shutdown(gw_pool_t *p, void (*done)(void *ud), void *ud)
{
    if (p->closing)
        return;
    p->closing = true;
    p->done = done;
    p->done_ud = ud;
    p->handles_open++; /* held until every close below is started */
    for (size_t i = 0; i < p->n; i++) {
        slot_t *s = &p->slots[i];
        if (s->retry_live) {
            uv_timer_stop(&s->retry);
            uv_close((uv_handle_t *)&s->retry, handle_closed);
            s->retry_live = false;
        }
        if (s->client != NULL)
            lnk_worker_client_close(s->client);
        if (s->w != NULL) {
            /* Stop generating: cancel nothing per request (the caller did), just stop. */
            eng_worker_free(s->w);
            s->w = NULL;
        }
        if (s->wake_live) {
            uv_close((uv_handle_t *)&s->wake, handle_closed);
            s->wake_live = false;
        }
        s->info.up = false;
    }
    if (--p->handles_open == 0 && p->done)
        p->done(p->done_ud);
}

void gw_pool_free(gw_pool_t *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->n; i++)
        eng_worker_free(p->slots[i].w);
    pc_free(p->slots);
    pc_free(p);
}
