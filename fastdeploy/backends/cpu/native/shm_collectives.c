/*
 * All-reduce (sum) and all-gather of float32 vectors between the rank processes of one host, through a shared
 * memory segment they all map (fastdeploy/parallel/shm_collectives.py sets it up). Every rank
 * passes a vector of the same length; an empty one is a no-op.
 *
 * Why: a tensor-parallel decode step all-reduces two small vectors per layer (SmolLM2: 576
 * floats). Through gloo over loopback TCP each took ~0.8 ms of wake-ups and system calls, which
 * made TP=2 decode 4-5x slower than TP=1 on two cores; here a rank spins on a cache line its
 * peers write, a few microseconds when they arrive together.
 *
 * Segment layout: `world` flags, each a uint64 on a cache line of its own, padded to 4 KiB; then
 * two generations of `world` slots of `slot_floats` floats. Call `seq` (1, 2, ...) writes its
 * chunk into generation seq % 2, slot `rank`, then publishes seq in its flag (release), waits
 * until every flag is >= seq (acquire), and sums the slots in rank order, so every rank computes
 * the same bits (or, for an all-gather, copies every slot out). Two generations make a second barrier unnecessary: a rank can write call seq + 2
 * into a generation only after every peer has published seq + 1, i.e. after each has finished
 * reading call seq from it.
 */
#include "native.h"

#include <sched.h>
#include <string.h>
#include <time.h>

#define FLAG_STRIDE 64 /* bytes: one flag per cache line */
#define SPINS_BEFORE_YIELD 4096

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static Py_ssize_t data_offset(int world) { return ((Py_ssize_t)world * FLAG_STRIDE + 4095) / 4096 * 4096; }

static uint64_t *flag_of(uint8_t *shm, int rank) { return (uint64_t *)(shm + (Py_ssize_t)rank * FLAG_STRIDE); }

/* Wait until every flag is >= seq; 0, or -1 past the deadline (a peer died or hangs). Spins first
 * (peers usually arrive within microseconds), then yields the core, which a descheduled peer may
 * need: ranks share the host's cores with each other and the engine. */
static int wait_for_peers(uint8_t *shm, int world, uint64_t seq, double deadline)
{
    for (int peer = 0; peer < world; peer++) {
        const uint64_t *flag = flag_of(shm, peer);
        unsigned spins = 0;
        while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < seq) {
            if (++spins < SPINS_BEFORE_YIELD) {
                __builtin_ia32_pause();
                continue;
            }
            sched_yield();
            if ((spins & 255) == 0 && now_seconds() > deadline) return -1;
        }
    }
    return 0;
}

/* Run one collective over shm in chunks of slot_floats: publish this rank's chunk, wait for the
 * others', then sum the chunks into x (out == NULL) or copy each rank's chunk to out[rank * n + ..]. */
static int exchange(uint8_t *base, float *values, float *out, Py_ssize_t floats, int rank, int world,
                    unsigned long long *seq, Py_ssize_t slot_floats, double timeout)
{
    float *data = (float *)(base + data_offset(world));
    const double deadline = now_seconds() + timeout;
    for (Py_ssize_t start = 0; start < floats; start += slot_floats, (*seq)++) {
        const Py_ssize_t count = floats - start < slot_floats ? floats - start : slot_floats;
        float *generation = data + (Py_ssize_t)(*seq % 2) * world * slot_floats;
        memcpy(generation + (Py_ssize_t)rank * slot_floats, values + start, (size_t)count * sizeof(float));
        __atomic_store_n(flag_of(base, rank), (uint64_t)*seq, __ATOMIC_RELEASE);
        if (wait_for_peers(base, world, *seq, deadline) != 0) return -1;
        if (out != NULL) {
            for (int peer = 0; peer < world; peer++)
                memcpy(out + (Py_ssize_t)peer * floats + start, generation + (Py_ssize_t)peer * slot_floats,
                       (size_t)count * sizeof(float));
            continue;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            float sum = generation[i];
            for (int peer = 1; peer < world; peer++) sum += generation[(Py_ssize_t)peer * slot_floats + i];
            values[start + i] = sum;
        }
    }
    return 0;
}

/* shm_collective(shm, x, out, rank, world, seq, slot_floats, timeout) -> the next seq. With out None,
 * x becomes the sum of every rank's x; else out (world times x's length) gets every rank's x in
 * rank order. */
PyObject *native_shm_collective(PyObject *self, PyObject *args)
{
    Py_buffer shm, x, out = {0};
    PyObject *out_object;
    int rank, world;
    unsigned long long seq;
    Py_ssize_t slot_floats;
    double timeout;
    if (!PyArg_ParseTuple(args, "w*w*OiiKnd", &shm, &x, &out_object, &rank, &world, &seq, &slot_floats, &timeout))
        return NULL;
    PyObject *result = NULL;
    const int gather = out_object != Py_None;
    if (gather && PyObject_GetBuffer(out_object, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
        PyBuffer_Release(&shm);
        PyBuffer_Release(&x);
        return NULL;
    }
    const Py_ssize_t floats = x.len / (Py_ssize_t)sizeof(float);
    const Py_ssize_t needed = data_offset(world) + 2 * (Py_ssize_t)world * slot_floats * (Py_ssize_t)sizeof(float);
    if (world < 1 || rank < 0 || rank >= world || slot_floats < 1 || seq < 1) {
        PyErr_Format(PyExc_ValueError, "shm_collective: rank %d of %d, slot of %zd floats, seq %llu", rank, world,
                     slot_floats, seq);
    } else if (shm.len < needed || x.len % (Py_ssize_t)sizeof(float) != 0 || (gather && out.len != world * x.len)) {
        PyErr_Format(PyExc_ValueError, "shm_collective: segment of %zd bytes (needs %zd), vector of %zd bytes, out of %zd",
                     shm.len, needed, x.len, gather ? out.len : (Py_ssize_t)0);
    } else {
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = exchange(shm.buf, x.buf, gather ? out.buf : NULL, floats, rank, world, &seq, slot_floats, timeout);
        Py_END_ALLOW_THREADS
        if (status != 0)
            PyErr_Format(PyExc_TimeoutError, "shm_collective: rank %d waited %ld ms for the other ranks of its group",
                         rank, (long)(timeout * 1000));
        else
            result = PyLong_FromUnsignedLongLong(seq);
    }
    PyBuffer_Release(&shm);
    PyBuffer_Release(&x);
    if (gather) PyBuffer_Release(&out);
    return result;
}
