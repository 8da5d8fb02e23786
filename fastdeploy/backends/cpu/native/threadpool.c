/*
 * The kernels' thread pool: parallel loops that never wait for a thread that has not started.
 *
 * Why not OpenMP: an OpenMP parallel region ends in a barrier every thread of the team must reach,
 * and its loops split work statically. When another process holds a core, the descheduled thread
 * stalls every region (a decode step runs ~150 of them), and libgomp's waiting threads spin for
 * 300,000 iterations, taking CPU time from the very thread they wait for: two threads beside one
 * CPU hog ran 10x slower than one thread.
 *
 * Here a loop is a job of `tasks` indices. The caller publishes it and claims indices itself, one at
 * a time, with the workers (a compare-and-swap on one word: generation << 32 | next index). A worker
 * that is not running simply claims nothing; the caller waits only for indices already claimed, so
 * a loop costs at most one straggling task, never a whole share. Waiting (workers for the next job,
 * the caller for stragglers) spins for a bounded time, then sleeps on a futex, leaving the core to
 * whoever needs it (the straggler included).
 *
 * One job runs at a time: a second Python thread calling a kernel meanwhile runs its loop inline.
 *
 * With adaptation on (the default thread count: fd_set_adaptive), each loop runs on the thread count
 * thread_adapt.c has measured fastest lately, at most the count asked for, and reports its time.
 */
#include "native.h"
#include "thread_adapt.h"

#include <immintrin.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256
#define INVALID_INDEX 0xFFFFFFFFu

static struct {
    pthread_mutex_t submit; /* held by the caller of the running job */
    int workers;            /* started workers: slots 1..workers */
    _Atomic uint64_t claim; /* generation << 32 | next unclaimed index */
    _Atomic uint32_t generation;
    _Atomic uint32_t done; /* indices finished in the current job */
    _Atomic int caller_sleeping;
    _Atomic int sleepers; /* workers asleep on `generation` */
    _Atomic long spin_ns;
    /* the current job, written before its generation is published (read racily by late workers,
     * whose claims then fail: see claim_and_run) */
    _Atomic(fd_task_fn) fn;
    _Atomic(void *) ctx;
    _Atomic uint32_t tasks;
    _Atomic int threads;
    _Atomic int adaptive;
    _Atomic uint64_t step_shape; /* mixed into loop kinds: the same kernel costs more on more rows */
    struct thread_adapt adapt; /* under `submit` */
} pool = {.submit = PTHREAD_MUTEX_INITIALIZER, .spin_ns = 100000};

static void futex_wait(_Atomic uint32_t *word, uint32_t expected)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word, int count)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Waits until (*word == value) == equal: spins for the pool's budget, then sleeps on the futex,
 * counting itself in *sleeping meanwhile so the thread that changes the word knows to wake it. */
static void wait_until(_Atomic uint32_t *word, uint32_t value, int equal, _Atomic int *sleeping)
{
    const long deadline = now_ns() + atomic_load_explicit(&pool.spin_ns, memory_order_relaxed);
    uint32_t seen;
    while (((seen = atomic_load(word)) == value) != equal) {
        if (now_ns() < deadline) {
            for (int i = 0; i < 32; i++) _mm_pause();
            continue;
        }
        atomic_fetch_add(sleeping, 1);
        /* re-read after announcing the sleep: the waker reads `sleeping` after changing the word */
        if (((seen = atomic_load(word)) == value) != equal) futex_wait(word, seen);
        atomic_fetch_sub(sleeping, 1);
    }
}

/* Claims and runs indices of job `generation` until none is left; the claim fails (and nothing
 * runs) once the job is finished, so a late worker can never run a task of a job whose context is
 * gone: the caller invalidates the claim word before it rewrites the job fields. */
static void claim_and_run(uint32_t generation, int slot)
{
    uint64_t word = atomic_load(&pool.claim);
    for (;;) {
        if ((uint32_t)(word >> 32) != generation) return;
        const uint32_t index = (uint32_t)word;
        const uint32_t tasks = atomic_load(&pool.tasks);
        const fd_task_fn fn = atomic_load(&pool.fn);
        void *ctx = atomic_load(&pool.ctx);
        if (index >= tasks || slot >= atomic_load(&pool.threads)) return;
        if (!atomic_compare_exchange_weak(&pool.claim, &word, word + 1)) continue;
        /* claimed: the job cannot finish before this index is done, so fn/ctx/tasks were its own */
        fn(ctx, index, slot);
        if (atomic_fetch_add(&pool.done, 1) + 1 == tasks && atomic_load(&pool.caller_sleeping))
            futex_wake(&pool.done, 1);
        word = atomic_load(&pool.claim);
    }
}

static void *worker_main(void *arg)
{
    const int slot = (int)(intptr_t)arg;
    uint32_t seen = atomic_load(&pool.generation);
    for (;;) {
        wait_until(&pool.generation, seen, 0, &pool.sleepers);
        seen = atomic_load(&pool.generation);
        claim_and_run(seen, slot);
    }
    return NULL;
}

/* Starts workers up to slot threads - 1 (the caller holds `submit`); returns the threads usable. */
static int ensure_workers(int threads)
{
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    while (pool.workers < threads - 1) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old); /* signals stay with Python's threads */
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int failed = pthread_create(&thread, &attr, worker_main, (void *)(intptr_t)(pool.workers + 1));
        pthread_attr_destroy(&attr);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (failed) break;
        pool.workers++;
    }
    return pool.workers + 1 < threads ? pool.workers + 1 : threads;
}

/* Runs the job on `threads` threads (the caller holds `submit`). */
static void run_job(Py_ssize_t tasks, int threads, fd_task_fn fn, void *ctx)
{
    threads = ensure_workers(threads);
    const uint32_t generation = atomic_load(&pool.generation) + 1;
    atomic_store(&pool.fn, fn);
    atomic_store(&pool.ctx, ctx);
    atomic_store(&pool.tasks, (uint32_t)tasks);
    atomic_store(&pool.threads, threads);
    atomic_store(&pool.done, 0);
    atomic_store(&pool.claim, (uint64_t)generation << 32);
    atomic_store(&pool.generation, generation);
    if (atomic_load(&pool.sleepers) > 0) futex_wake(&pool.generation, INT_MAX);
    claim_and_run(generation, 0);
    /* then for the indices other threads claimed */
    wait_until(&pool.done, (uint32_t)tasks, 1, &pool.caller_sleeping);
    atomic_store(&pool.claim, ((uint64_t)generation << 32) | INVALID_INDEX);
}

static void run_inline(Py_ssize_t tasks, fd_task_fn fn, void *ctx)
{
    for (Py_ssize_t i = 0; i < tasks; i++) fn(ctx, i, 0);
}

/* The kind of a loop for thread_adapt.c: its kernel, task count and the step's shape (a product's
 * tasks are its column panels, whatever its rows). Never 0, a free slot's id. */
static uint64_t loop_kind(fd_task_fn fn, Py_ssize_t tasks)
{
    uint64_t id = (uint64_t)(uintptr_t)fn * 0x100000001B3ull ^ (uint64_t)tasks;
    id = (id ^ atomic_load_explicit(&pool.step_shape, memory_order_relaxed)) * 0x9E3779B97F4A7C15ull;
    return id ? id : 1;
}

void fd_parallel_for(Py_ssize_t tasks, int threads, fd_task_fn fn, void *ctx)
{
    if (tasks <= 0) return;
    if (threads <= 1 || tasks == 1 || tasks >= INVALID_INDEX || pthread_mutex_trylock(&pool.submit) != 0) {
        run_inline(tasks, fn, ctx);
        return;
    }
    if (!atomic_load_explicit(&pool.adaptive, memory_order_relaxed)) {
        run_job(tasks, threads, fn, ctx);
    } else {
        const long start = now_ns();
        threads = adapt_threads(&pool.adapt, threads);
        if (threads > 1) run_job(tasks, threads, fn, ctx);
        else run_inline(tasks, fn, ctx);
        adapt_record(&pool.adapt, loop_kind(fn, tasks), start, now_ns());
    }
    pthread_mutex_unlock(&pool.submit);
}

void fd_set_spin_ns(long nanoseconds) { atomic_store(&pool.spin_ns, nanoseconds < 0 ? 0 : nanoseconds); }

long fd_spin_ns(void) { return atomic_load(&pool.spin_ns); }

void fd_set_adaptive(int on)
{
    pthread_mutex_lock(&pool.submit);
    if (on && !atomic_load(&pool.adaptive)) adapt_init(&pool.adapt); /* measurements start afresh */
    atomic_store(&pool.adaptive, on != 0);
    pthread_mutex_unlock(&pool.submit);
}

void fd_set_step_shape(uint64_t shape) { atomic_store_explicit(&pool.step_shape, shape, memory_order_relaxed); }

void fd_adaptive_state(int *adaptive, int *threads, long *probes, long *switches)
{
    pthread_mutex_lock(&pool.submit);
    *adaptive = atomic_load(&pool.adaptive);
    *threads = pool.adapt.limit ? adapt_threads(&pool.adapt, pool.adapt.limit) : 0;
    *probes = pool.adapt.probes;
    *switches = pool.adapt.switches;
    pthread_mutex_unlock(&pool.submit);
}

/* After fork() only the forking thread exists: the child starts a fresh pool when it needs one. */
static void reset_after_fork(void)
{
    pthread_mutex_init(&pool.submit, NULL);
    pool.workers = 0;
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.caller_sleeping, 0);
}

__attribute__((constructor)) static void register_fork_handler(void) { pthread_atfork(NULL, NULL, reset_after_fork); }

/* Per-thread scratch memory, grown on demand and freed when the thread exits. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
struct scratch {
    size_t bytes;
    void *data;
};

static void free_scratch(void *p)
{
    struct scratch *s = p;
    free(s->data);
    free(s);
}

static void make_scratch_key(void) { pthread_key_create(&scratch_key, free_scratch); }

void *fd_thread_scratch(size_t bytes)
{
    pthread_once(&scratch_once, make_scratch_key);
    struct scratch *s = pthread_getspecific(scratch_key);
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->bytes < bytes) {
        free(s->data);
        s->bytes = 0;
        s->data = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (s->data == NULL) return NULL;
        s->bytes = bytes;
    }
    return s->data;
}
