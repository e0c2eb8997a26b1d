/*
 * cpu_pool.c — the CPU backend's thread pool (see cpu.h).
 *
 * A run publishes (fn, ctx, n_tasks) and then one 64-bit word, `claim`: the run's generation in
 * the high half, the next unclaimed task in the low half. Workers spin on the generation for a
 * short while (a forward step issues dozens of runs back to back, and a wake-up through the
 * condition variable costs more than a small kernel), then sleep on the condition variable. A
 * thread claims a task by a compare-and-swap of `claim` that checks the generation too, and
 * counts it done when it has run; the caller takes tasks like the workers and returns when every
 * task is done, not when every worker has looked at the run. On a machine whose other load has
 * taken a worker's core, the caller runs the tasks alone instead of waiting a scheduler time
 * slice for that worker to wake up and find nothing left (with two threads and a pool run per
 * matrix product, that wait was the decode's largest loss under load).
 *
 * Why a late worker is harmless: it reads (fn, ctx, n_tasks) after loading `claim`, and calls
 * fn only if its compare-and-swap on the value it loaded succeeds. Between two runs the caller
 * first closes `claim` (a new generation whose next task is UINT32_MAX, which nobody can claim),
 * then writes the next run's fields, then opens `claim` with the generation after. So a claim
 * that succeeds was made before the close, on fields that were its run's (the caller changes
 * them only after every task of that run is done, and it waits for the claimed task); a worker
 * that read fields across a close fails its claim and calls nothing.
 */
#include "cpu.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "pc_alloc.h"
#include "pc_err.h"

/* Polls of the generation before a worker sleeps; every POOL_YIELD polls it yields, so on an
 * oversubscribed machine a waiting thread hands its core to the one it waits for. */
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
    /* The current run, written by the caller before it publishes `claim`. */
    _Atomic(eng_pool_fn) fn;
    _Atomic(void *) ctx;
    atomic_uint n_tasks;
    atomic_uint_least64_t claim; /* generation << 32 | next unclaimed task */
    atomic_uint n_done;          /* tasks of the current run done */
    atomic_bool stop;
};

typedef struct worker_arg {
    eng_pool_t *pool;
    uint32_t index;
} worker_arg_t;

static uint32_t claim_gen(uint64_t v)
{
    return (uint32_t)(v >> 32);
}

/* Claims and runs tasks of generation gen until none is left (or a newer run started). */
static void run_tasks(eng_pool_t *p, uint32_t gen, uint32_t thread)
{
    uint64_t v = atomic_load_explicit(&p->claim, memory_order_acquire);
    while (claim_gen(v) == gen) {
        uint32_t t = (uint32_t)v;
        eng_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_acquire);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_acquire);
        if (t >= atomic_load_explicit(&p->n_tasks, memory_order_acquire))
            return;
        /* On failure v is reloaded: another thread took t, or a new run began. */
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        fn(ctx, t, thread);
        atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
        v = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

static void *worker_main(void *arg)
{
    worker_arg_t *wa = arg;
    eng_pool_t *p = wa->pool;
    uint32_t index = wa->index;
    pc_free(wa);
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = claim_gen(atomic_load_explicit(&p->claim, memory_order_acquire))) == seen &&
               !atomic_load(&p->stop) && spins < POOL_SPIN) {
            if (++spins % POOL_YIELD == 0)
                sched_yield();
            else
                cpu_relax();
        }
        if (gen == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while ((gen = claim_gen(atomic_load(&p->claim))) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = gen;
        run_tasks(p, gen, index);
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
    /* Every task of the previous run is done. Closed, then the fields, then open (see the top).
     * The fields are stored with release and loaded with acquire: a worker that sees a new field
     * thereby sees the close, so its claim on an older value fails. */
    uint32_t gen = claim_gen(atomic_load_explicit(&p->claim, memory_order_relaxed)) + 2;
    atomic_store_explicit(&p->claim, (uint64_t)(gen - 1) << 32 | UINT32_MAX, memory_order_release);
    atomic_store_explicit(&p->fn, fn, memory_order_release);
    atomic_store_explicit(&p->ctx, ctx, memory_order_release);
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_release);
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->claim, (uint64_t)gen << 32, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, gen, 0);
    for (uint32_t spins = 1; atomic_load_explicit(&p->n_done, memory_order_acquire) != n_tasks;
         spins++) {
        if (spins % POOL_YIELD == 0)
            sched_yield();
        else
            cpu_relax();
    }
}
