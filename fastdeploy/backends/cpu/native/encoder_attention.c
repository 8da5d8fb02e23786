/*
 * Bidirectional attention within segments, without a cache: a vision encoder's attention, where the
 * tokens of one image (or one video frame) attend to each other only. The Python entry point lays
 * each (segment, head)'s keys out transposed and its values row by row, as the paged kernels read a
 * cache block, then runs the instruction set's row kernel (row_kernels.h) over work items of
 * ENCODER_TILE query tokens of one head of one segment.
 */
#include "native.h"

#include <string.h>

#define ENCODER_PAD 64 /* segment lengths round up to this (a multiple of every ATTN_CHUNK) */

struct encoder_job {
    void (*kernel)(ENCODER_ARGS);
    const struct encoder_item *items;
    const float *q, *k, *v;
    float *out, *keys_t, *values;
    const int64_t *starts;     /* [segments + 1] first token of each segment, then the token count */
    const Py_ssize_t *offsets; /* [segments] first float of each segment's laid-out keys (and values) */
    Py_ssize_t heads, head_dim, longest;
    float scale;
    _Atomic int out_of_memory;
};

/* A segment's key row length in floats: whole chunks, and never a multiple of 1024 floats (4 KiB), where
 * the score loop's head_dim key rows would all fall in the same few L1 sets (a 1024-token image ran
 * ~3.5% slower so). */
static Py_ssize_t padded_length(Py_ssize_t count)
{
    const Py_ssize_t padded = (count + ENCODER_PAD - 1) / ENCODER_PAD * ENCODER_PAD;
    return padded % 1024 == 0 ? padded + ENCODER_PAD : padded;
}

/* Keys and values of segment index / heads, head index % heads, into their layout. */
static void layout_task(void *ctx, Py_ssize_t index, int slot)
{
    struct encoder_job *job = ctx;
    const Py_ssize_t s = index / job->heads, h = index % job->heads, head_dim = job->head_dim;
    const Py_ssize_t start = job->starts[s], count = job->starts[s + 1] - start, padded = padded_length(count);
    const Py_ssize_t row = job->heads * head_dim;
    float *keys_t = job->keys_t + job->offsets[s] + h * head_dim * padded;
    float *values = job->values + job->offsets[s] + h * padded * head_dim;
    for (Py_ssize_t j = 0; j < count; j++) {
        const float *key = job->k + (start + j) * row + h * head_dim;
        for (Py_ssize_t d = 0; d < head_dim; d++) keys_t[d * padded + j] = key[d];
        memcpy(values + j * head_dim, job->v + (start + j) * row + h * head_dim, (size_t)head_dim * sizeof(float));
    }
    (void)slot;
}

static void attend_task(void *ctx, Py_ssize_t index, int slot)
{
    struct encoder_job *job = ctx;
    const struct encoder_item *item = &job->items[index];
    const Py_ssize_t head_dim = job->head_dim, row = job->heads * head_dim;
    float *scratch = fd_thread_scratch((size_t)ENCODER_ROWS_AT_ONCE * (size_t)(2 * head_dim + job->longest) * sizeof(float));
    if (scratch == NULL) {
        job->out_of_memory = 1;
        return;
    }
    const Py_ssize_t start = job->starts[item->segment], count = job->starts[item->segment + 1] - start;
    const Py_ssize_t padded = padded_length(count), offset = job->offsets[item->segment];
    const Py_ssize_t first = (start + item->token0) * row + item->head * head_dim;
    job->kernel(job->q + first, job->out + first, item->tokens, row, job->keys_t + offset + item->head * head_dim * padded,
                job->values + offset + item->head * padded * head_dim, padded, count, head_dim, job->scale, scratch);
    (void)slot;
}

int encoder_segments_valid(const int64_t *starts, Py_ssize_t segments, Py_ssize_t tokens)
{
    if (segments < 0 || (segments == 0 ? tokens != 0 : starts[0] != 0 || starts[segments] != tokens)) return 0;
    for (Py_ssize_t s = 0; s < segments; s++)
        if (starts[s + 1] < starts[s]) return 0;
    return 1;
}

int encoder_plan_build(struct encoder_plan *plan, const int64_t *starts, Py_ssize_t segments, Py_ssize_t heads,
                       Py_ssize_t per_key, Py_ssize_t (*padded_length)(Py_ssize_t))
{
    *plan = (struct encoder_plan){.longest = 1};
    plan->offsets = PyMem_RawMalloc((size_t)(segments > 0 ? segments : 1) * sizeof(Py_ssize_t));
    if (plan->offsets == NULL) return -1;
    for (Py_ssize_t s = 0; s < segments; s++) {
        const Py_ssize_t length = starts[s + 1] - starts[s], padded = padded_length(length);
        plan->offsets[s] = plan->laid_out;
        plan->laid_out += padded * heads * per_key;
        plan->longest = padded > plan->longest ? padded : plan->longest;
        plan->count += (length + ENCODER_TILE - 1) / ENCODER_TILE * heads;
    }
    plan->items = PyMem_RawMalloc((size_t)(plan->count > 0 ? plan->count : 1) * sizeof(struct encoder_item));
    if (plan->items == NULL) return -1;
    Py_ssize_t n = 0;
    for (Py_ssize_t s = 0; s < segments; s++)
        for (Py_ssize_t h = 0; h < heads; h++)
            for (Py_ssize_t t0 = 0; t0 < starts[s + 1] - starts[s]; t0 += ENCODER_TILE) {
                const Py_ssize_t left = starts[s + 1] - starts[s] - t0;
                plan->items[n++] = (struct encoder_item){s, h, t0, left < ENCODER_TILE ? left : ENCODER_TILE};
            }
    return 0;
}

void encoder_plan_free(struct encoder_plan *plan)
{
    PyMem_RawFree(plan->items);
    PyMem_RawFree(plan->offsets);
}

/* encoder_attention(q, k, v, out, cu_seqlens, tokens, heads, head_dim, scale, isa, threads)
 * q/k/v/out [tokens, heads, head_dim] float32; tokens cu_seqlens[i]..cu_seqlens[i+1] attend to each other. */
PyObject *native_encoder_attention(PyObject *self, PyObject *args)
{
    Py_buffer q, k, v, out, cu;
    Py_ssize_t tokens, heads, head_dim;
    double scale;
    const char *isa_str;
    int threads;
    if (!PyArg_ParseTuple(args, "y*y*y*w*y*nnndsi", &q, &k, &v, &out, &cu, &tokens, &heads, &head_dim, &scale,
                          &isa_str, &threads))
        return NULL;
    PyObject *result = NULL;
    struct encoder_plan plan = {0};
    float *keys_t = NULL, *values = NULL;
    const struct row_kernels *kernels = native_row_kernels(isa_str);
    if (kernels == NULL) goto done;
    const Py_ssize_t segments = cu.len / (Py_ssize_t)sizeof(int64_t) - 1;
    const int64_t *starts = cu.buf;
    const Py_ssize_t bytes = tokens * heads * head_dim * (Py_ssize_t)sizeof(float);
    if (heads <= 0 || head_dim <= 0 || q.len != bytes || k.len != bytes || v.len != bytes || out.len != bytes ||
        !encoder_segments_valid(starts, segments, tokens)) {
        PyErr_SetString(PyExc_ValueError,
                        "encoder_attention: buffer sizes do not match the shapes, or cu_seqlens is not 0 .. tokens ascending");
        goto done;
    }
    if (encoder_plan_build(&plan, starts, segments, heads, head_dim, padded_length) < 0) goto no_memory;
    /* zeroed: the padding past a segment's keys is read (and its scores dropped) by the score loop */
    keys_t = PyMem_RawCalloc((size_t)(plan.laid_out > 0 ? plan.laid_out : 1), sizeof(float));
    values = PyMem_RawMalloc((size_t)(plan.laid_out > 0 ? plan.laid_out : 1) * sizeof(float));
    if (keys_t == NULL || values == NULL) goto no_memory;
    struct encoder_job job = {
        .kernel = head_dim == 64 ? kernels->encoder_attend_d64 : kernels->encoder_attend_any,
        .items = plan.items, .q = q.buf, .k = k.buf, .v = v.buf, .out = out.buf, .keys_t = keys_t, .values = values,
        .starts = starts, .offsets = plan.offsets, .heads = heads, .head_dim = head_dim, .longest = plan.longest,
        .scale = (float)scale,
    };
    Py_BEGIN_ALLOW_THREADS
    fd_parallel_for(segments * heads, threads, layout_task, &job);
    fd_parallel_for(plan.count, threads, attend_task, &job);
    Py_END_ALLOW_THREADS
    if (job.out_of_memory) goto no_memory;
    result = Py_NewRef(Py_None);
    goto done;
no_memory:
    PyErr_NoMemory();
done:
    encoder_plan_free(&plan);
    PyMem_RawFree(keys_t);
    PyMem_RawFree(values);
    PyBuffer_Release(&q);
    PyBuffer_Release(&k);
    PyBuffer_Release(&v);
    PyBuffer_Release(&out);
    PyBuffer_Release(&cu);
    return result;
}
