/*
 * cpu_pool.c — the CPU backend's thread pool (see cpu.h).
 *
 * A run publishes (fn, ctx, n_tasks) and bumps a generation counter; workers spin on the
 * counter for a short while (a forward step issues dozens of runs back to back, and a wake-up
 * through the condition variable costs more than a small kernel), then sleep on the condition
 * variable. Tasks are claimed through an atomic counter; the caller takes tasks too and then
 * waits until every worker has left the run.
 */
#include "cpu.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "pc_alloc.h"
#include "pc_err.h"

/* Polls of the generation counter before a worker sleeps; every POOL_YIELD polls it yields, so
 * on an oversubscribed machine a waiting thread hands its core to the one it waits for. */
#define POOL_SPIN 4096
#define POOL_YIELD 64

/* A spin-wait hint to the core (x86 PAUSE, aarch64 YIELD), nothing elsewhere. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ volatile("yield" ::: "memory");
#endif
}

struct eng_pool {
    uint32_t n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    eng_pool_fn fn;
    void *ctx;
    uint32_t n_tasks;
    atomic_uint next_task;
    atomic_uint generation;
    atomic_uint n_busy; /* workers still inside the current run */
    atomic_bool stop;
};

typedef struct worker_arg {
    eng_pool_t *pool;
    uint32_t index;
} worker_arg_t;

static void run_tasks(eng_pool_t *p, uint32_t thread)
{
    for (;;) {
        uint32_t t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (t >= p->n_tasks)
            break;
        p->fn(p->ctx, t, thread);
    }
}

static void *worker_main(void *arg)
{
    worker_arg_t *wa = arg;
    eng_pool_t *p = wa->pool;
    uint32_t index = wa->index;
    pc_free(wa);
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop) && spins < POOL_SPIN) {
            if (++spins % POOL_YIELD == 0)
                sched_yield();
            else
                cpu_relax();
        }
        if (gen == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while ((gen = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = gen;
        run_tasks(p, index);
        atomic_fetch_sub_explicit(&p->n_busy, 1, memory_order_release);
    }
}

int eng__pool_init(uint32_t n_threads, eng_pool_t **out)
{
    *out = NULL;
    if (n_threads == 0 || n_threads > 256)
        return PC_ERR_INVAL;
    eng_pool_t *p = pc_calloc(1, sizeof *p);
    if (p == NULL)
        return PC_ERR_NOMEM;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = pc_calloc(n_threads, sizeof *p->threads);
    if (p->threads == NULL) {
        eng__pool_free(p);
        return PC_ERR_NOMEM;
    }
    for (uint32_t i = 1; i < n_threads; i++) {
        worker_arg_t *wa = pc_malloc(sizeof *wa);
        if (wa == NULL) {
            p->n_threads = i;
            eng__pool_free(p);
            return PC_ERR_NOMEM;
        }
        wa->pool = p;
        wa->index = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            pc_free(wa);
            p->n_threads = i;
            eng__pool_free(p);
            return PC_ERR_NOMEM;
        }
    }
    *out = p;
    return 0;
}

void eng__pool_free(eng_pool_t *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pc_free(p->threads);
    pc_free(p);
}

uint32_t eng__pool_n_threads(const eng_pool_t *p)
{
    return p->n_threads;
}

void eng__pool_run(eng_pool_t *p, eng_pool_fn fn, void *ctx, uint32_t n_tasks)
{
    if (n_tasks == 0)
        return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (uint32_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&p->n_busy, p->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, 0);
    for (uint32_t spins = 1; atomic_load_explicit(&p->n_busy, memory_order_acquire) != 0; spins++) {
        if (spins % POOL_YIELD == 0)
            sched_yield();
        else
            cpu_relax();
    }
}
