/*
 * How many threads the pool's loops run on when the thread count is the default: the count measured
 * fastest lately (thread_adapt.c). threadpool.c calls it under its submit lock; module.c replays
 * synthetic costs through it for the tests.
 */
#ifndef FASTDEPLOY_THREAD_ADAPT_H
#define FASTDEPLOY_THREAD_ADAPT_H

#include <stdint.h>

#define ADAPT_KEYS 64 /* loop kinds remembered (a decode step has fewer than 10) */

/* The recent cost of one kind of loop (kernel, task count) on the incumbent thread count. */
struct adapt_key {
    uint64_t id;   /* 0: free slot */
    double recent; /* ns per loop, including the gap since the previous loop; < 0 while not measured */
    double sum;    /* this window's ns and loops on the incumbent */
    long count;
};

struct thread_adapt {
    int incumbent;        /* threads outside probes */
    int probe;            /* threads of the probe window under way, 0 when none */
    int limit;            /* the thread count the caller asked for last */
    int windows_to_probe; /* incumbent windows left before the next probe */
    int interval;         /* windows between probes: doubles after a lost probe, up to ADAPT_MAX_INTERVAL */
    int confirming;       /* a count whose probe won once and is probed again next, 0 when none */
    int direction;        /* the next probe tries one thread fewer (-1) or more (+1) when both exist */
    int regions;          /* loops of the current window's warm-up so far */
    int warm;             /* the warm-up is over */
    int counted;          /* loops counted after it */
    double spent;         /* the window's ns so far, warm-up included */
    int slower;           /* the last incumbent window ran ADAPT_DRIFT slower than its loops' recent costs */
    int priced;           /* counted loops of the window whose kind had a recent incumbent cost */
    double cost;          /* the window's ns over loops whose kind has a recent incumbent cost, */
    double expected;      /* and what those loops cost on the incumbent */
    long last_end_ns;     /* when the previous loop ended (0: none yet) */
    long probes, switches;
    struct adapt_key keys[ADAPT_KEYS];
};

void adapt_init(struct thread_adapt *a);
/* Threads for the next loop, at most `limit` (the caller's thread count). */
int adapt_threads(struct thread_adapt *a, int limit);
/* One loop of kind `key` ran from start_ns to end_ns on the threads adapt_threads gave. */
void adapt_record(struct thread_adapt *a, uint64_t key, long start_ns, long end_ns);

#endif
