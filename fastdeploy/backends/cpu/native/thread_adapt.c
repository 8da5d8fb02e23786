/*
 * The default thread count follows the load: the loops run on the count measured fastest lately.
 *
 * Why: the pool never waits for a descheduled worker's share, but with one CPU hog on a 2-core
 * machine two threads still lost to one (decode 62 against 83 tok/s): three runnable threads share
 * two cores, so the caller, whose Python glue and loop starts are the critical path of every step,
 * gets about 2/3 of a core, while one thread gets a whole core to itself. Nothing inside a loop
 * tells which count wins (the worker's share, how late it starts and the caller's waits all look
 * alike under other loads: under load 15 two threads beat one), so the pool times both.
 *
 * How: a loop's cost is the time from the end of the previous loop to its own end (the Python glue
 * between loops included; a gap over ADAPT_IDLE_NS is idleness and not counted). Loops of one kind
 * (the same kernel, task count and step shape, which the backend sets per forward pass: a layer's
 * qkv product, its attention...) cost the same from one layer and step to the next, so each kind
 * keeps its recent cost on the incumbent thread count.
 *
 * Windows of ADAPT_WINDOW loops (after ADAPT_WARMUP uncounted ones, for wake-ups) run on the
 * incumbent, and every `interval` windows one probe window runs on one thread fewer or more; the
 * probe's loops are priced at their kinds' recent incumbent costs. A count whose probe ran at least
 * ADAPT_MARGIN faster twice in a row (one incumbent window between: other processes' load moves
 * the cost of one window by +-20%) becomes the incumbent. A lost probe doubles the interval (quiet
 * machine: 1 window in 65 on the slower count); two incumbent windows in a row ADAPT_DRIFT slower
 * than their loops' recent costs (the load changed) bring the next probe forward. A probe that
 * meets loops of unknown cost (a prefill, a new batch size) stops early: it has nothing to be
 * compared with. A probe also ends once it has run ADAPT_PROBE_NS (its warm-up ADAPT_PROBE_WARMUP_NS)
 * and counted ADAPT_PROBE_MIN_LOOPS: a window of 144 loops is about one decode step, but half of a
 * 512-token prefill (loops of milliseconds), which a losing probe of one thread ran alone (measured,
 * ERNIE-shaped prefills of one shape again and again on two threads: 2 in 8 took 1.6x as long).
 *
 * Results never depend on the count (each output element is computed by one task), only the speed.
 */
#include "thread_adapt.h"

#include <string.h>

#define ADAPT_WINDOW 128             /* counted loops per window: about one decode step of SmolLM2 */
#define ADAPT_WARMUP 16              /* loops at the start of a window that are not counted */
#define ADAPT_MIN_INTERVAL 4         /* incumbent windows between probes after a change */
#define ADAPT_MAX_INTERVAL 64        /* ... and at most */
#define ADAPT_MARGIN 0.08            /* a probe must be this much faster, twice in a row, to take over */
#define ADAPT_DRIFT 0.2              /* two incumbent windows in a row this much slower: probe soon */
#define ADAPT_IDLE_NS 5000000L       /* a longer gap between loops is idleness, not glue */
#define ADAPT_MIN_MATCHED 0.5        /* a probe decides only if this share of its loops had a price */
#define ADAPT_MAX_UNPRICED 8         /* a probe meeting more loops of unknown cost stops (a prefill) */
#define ADAPT_PROBE_NS 100000000.0   /* a probe window ends after this long (once it counted ... */
#define ADAPT_PROBE_MIN_LOOPS 4      /* ... this many loops), whatever its loop count */
#define ADAPT_PROBE_WARMUP_NS 10000000.0 /* and its warm-up after this long */

void adapt_init(struct thread_adapt *a)
{
    memset(a, 0, sizeof(*a));
    a->incumbent = 1 << 30; /* clamped to the caller's count: start on every thread asked for */
    a->interval = ADAPT_MIN_INTERVAL;
    a->windows_to_probe = ADAPT_MIN_INTERVAL;
    a->direction = -1;
}

int adapt_threads(struct thread_adapt *a, int limit)
{
    a->limit = limit;
    if (a->incumbent > limit) a->incumbent = limit;
    const int threads = a->probe ? a->probe : a->incumbent;
    return threads < limit ? threads : limit;
}

static struct adapt_key *find_key(struct thread_adapt *a, uint64_t id, int insert)
{
    const unsigned home = (unsigned)((id * 0x9E3779B97F4A7C15ull) >> 58); /* 6 bits: ADAPT_KEYS */
    for (unsigned i = 0; i < 4; i++) {
        struct adapt_key *k = &a->keys[(home + i) % ADAPT_KEYS];
        if (k->id == id) return k;
        if (k->id == 0 && insert) {
            *k = (struct adapt_key){.id = id, .recent = -1.0};
            return k;
        }
    }
    if (!insert) return NULL;
    struct adapt_key *k = &a->keys[home]; /* a crowded neighbourhood: the newest kind wins the slot */
    *k = (struct adapt_key){.id = id, .recent = -1.0};
    return k;
}

/* The thread count the next probe tries, or 0 when there is no other count to try. */
static int next_probe(struct thread_adapt *a)
{
    if (a->confirming) return a->confirming;
    const int fewer = a->incumbent - 1, more = a->incumbent + 1;
    const int can_fewer = fewer >= 1, can_more = more <= a->limit;
    if (can_fewer && can_more) {
        a->direction = -a->direction;
        return a->direction < 0 ? fewer : more;
    }
    return can_fewer ? fewer : (can_more ? more : 0);
}

/* Every kind's recent cost halfway towards this window's mean; the window's sums restart. */
static void learn_window(struct thread_adapt *a)
{
    for (int i = 0; i < ADAPT_KEYS; i++) {
        struct adapt_key *k = &a->keys[i];
        if (k->id == 0 || k->count == 0) continue;
        const double mean = k->sum / (double)k->count;
        k->recent = k->recent < 0 ? mean : 0.5 * (k->recent + mean);
        k->sum = 0;
        k->count = 0;
    }
}

static void forget_costs(struct thread_adapt *a)
{
    for (int i = 0; i < ADAPT_KEYS; i++) a->keys[i] = (struct adapt_key){0};
}

static void restart_window(struct thread_adapt *a)
{
    a->regions = 0;
    a->counted = 0;
    a->warm = 0;
    a->spent = 0;
    a->priced = 0;
    a->cost = 0;
    a->expected = 0;
}

static void end_window(struct thread_adapt *a)
{
    const double ratio = a->expected > 0 ? a->cost / a->expected : 0.0;
    const int matched = a->priced > 0 && a->priced >= ADAPT_MIN_MATCHED * a->counted;
    if (a->probe) {
        if (matched && ratio < 1.0 - ADAPT_MARGIN && a->confirming == a->probe) {
            a->incumbent = a->probe; /* the costs learnt were the old incumbent's */
            forget_costs(a);
            a->interval = ADAPT_MIN_INTERVAL;
            a->confirming = 0;
            a->switches++;
        } else if (matched && ratio < 1.0 - ADAPT_MARGIN) {
            a->confirming = a->probe; /* won once: probe the same count again after one window */
        } else if (matched) {
            a->interval = a->interval * 2 < ADAPT_MAX_INTERVAL ? a->interval * 2 : ADAPT_MAX_INTERVAL;
            a->confirming = 0;
        }
        a->probe = 0;
        a->windows_to_probe = a->confirming ? 1 : a->interval;
    } else {
        learn_window(a);
        const int slower = matched && ratio > 1.0 + ADAPT_DRIFT;
        if (slower && a->slower && a->windows_to_probe > 1) {
            a->windows_to_probe = 1; /* twice in a row: the load changed; probe after one more window */
        } else if (--a->windows_to_probe <= 0) {
            a->probe = next_probe(a);
            a->windows_to_probe = a->interval;
            if (a->probe) a->probes++;
        }
        a->slower = slower;
    }
    restart_window(a);
}

void adapt_record(struct thread_adapt *a, uint64_t key, long start_ns, long end_ns)
{
    const long from = a->last_end_ns && start_ns - a->last_end_ns < ADAPT_IDLE_NS ? a->last_end_ns : start_ns;
    const double cost = (double)(end_ns - from);
    a->last_end_ns = end_ns;
    a->spent += cost;
    if (!a->warm) {
        a->warm = ++a->regions >= ADAPT_WARMUP || (a->probe && a->spent >= ADAPT_PROBE_WARMUP_NS);
        return;
    }
    a->counted++;
    struct adapt_key *k = find_key(a, key, !a->probe);
    if (k != NULL && !a->probe) {
        k->sum += cost;
        k->count++;
    }
    if (k != NULL && k->recent >= 0) {
        a->cost += cost;
        a->expected += k->recent;
        a->priced++;
    } else if (a->probe && a->counted - a->priced > ADAPT_MAX_UNPRICED) {
        /* new work (a prefill, another batch size): nothing to compare with; back to the incumbent */
        a->probe = 0;
        a->confirming = 0;
        restart_window(a);
        return;
    }
    if (a->counted >= ADAPT_WINDOW ||
        (a->probe && a->spent >= ADAPT_PROBE_NS && a->counted >= ADAPT_PROBE_MIN_LOOPS))
        end_window(a);
}
