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
    const struct encoder_input *in;
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
    const struct encoder_input *in = job->in;
    const Py_ssize_t s = index / job->heads, h = index % job->heads, head_dim = job->head_dim;
    const Py_ssize_t start = job->starts[s], count = job->starts[s + 1] - start, padded = padded_length(count);
    float *keys_t = job->keys_t + job->offsets[s] + h * head_dim * padded;
    float *values = job->values + job->offsets[s] + h * padded * head_dim;
    for (Py_ssize_t j = 0; j < count; j++) {
        const float *key = encoder_key_row(in, start + j, h, head_dim);
        for (Py_ssize_t d = 0; d < head_dim; d++) keys_t[d * padded + j] = key[d];
        memcpy(values + j * head_dim, in->v0 + (start + j) * in->stride + h * head_dim, (size_t)head_dim * sizeof(float));
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
    job->kernel(encoder_query_rows(job->in) + first, job->out + first, item->tokens, row, job->keys_t + offset + item->head * head_dim * padded,
                job->values + offset + item->head * padded * head_dim, padded, count, head_dim, job->scale, scratch);
    (void)slot;
}

int encoder_input_get(struct encoder_input *in, PyObject *const objects[5], const Py_ssize_t offsets[3],
                      Py_ssize_t stride, Py_ssize_t tokens, Py_ssize_t heads, Py_ssize_t head_dim, rotary_fn rotary,
                      const char *name)
{
    *in = (struct encoder_input){.stride = stride, .width = heads * head_dim, .rotary = rotary};
    Py_buffer *buffers[5] = {&in->q, &in->k, &in->v, &in->cos, &in->sin};
    const int tables = objects[3] != Py_None;
    for (int i = 0; i < (tables ? 5 : 3); i++)
        if (PyObject_GetBuffer(objects[i], buffers[i], PyBUF_SIMPLE) < 0) return -1;
    const Py_ssize_t width = in->width;
    int bad = heads <= 0 || head_dim <= 0 || tokens < 0 || stride < width;
    for (int i = 0; i < 3 && !bad; i++)
        bad = offsets[i] < 0 || (tokens > 0 && (offsets[i] + (tokens - 1) * stride + width) * (Py_ssize_t)sizeof(float) >
                                                   buffers[i]->len);
    if (tables && !bad) {
        in->half = tokens > 0 ? in->cos.len / (tokens * (Py_ssize_t)sizeof(float)) : 0;
        bad = in->cos.len != in->sin.len || in->half * tokens * (Py_ssize_t)sizeof(float) != in->cos.len ||
              (tokens > 0 && (in->half <= 0 || 2 * in->half > head_dim));
    }
    if (bad) {
        PyErr_Format(PyExc_ValueError, "%s: q/k/v do not hold tokens x heads x head_dim at their offsets and row "
                     "stride, or cos/sin are not [tokens, half] with 0 < 2 half <= head_dim", name);
        return -1;
    }
    in->q0 = (const float *)in->q.buf + offsets[0];
    in->k0 = (const float *)in->k.buf + offsets[1];
    in->v0 = (const float *)in->v.buf + offsets[2];
    const size_t bytes = (size_t)(tokens > 0 ? tokens : 1) * (size_t)width * sizeof(float);
    if ((tables || stride != width) && (in->queries = PyMem_RawMalloc(bytes)) == NULL) goto no_memory;
    if (tables && (in->keys = PyMem_RawMalloc(bytes)) == NULL) goto no_memory;
    return 0;
no_memory:
    PyErr_NoMemory();
    return -1;
}

void encoder_input_release(struct encoder_input *in)
{
    Py_buffer *buffers[5] = {&in->q, &in->k, &in->v, &in->cos, &in->sin};
    for (int i = 0; i < 5; i++)
        if (buffers[i]->obj) PyBuffer_Release(buffers[i]);
    PyMem_RawFree(in->queries);
    PyMem_RawFree(in->keys);
    in->queries = in->keys = NULL;
}

#define PREPARE_TOKENS 32 /* tokens per task of encoder_input_prepare */

/* Row t of x0 (all heads) into out: rotated when there are tables, else copied. */
static void rotate_or_copy(const struct encoder_input *in, const float *x0, Py_ssize_t t, float *out,
                           Py_ssize_t head_dim)
{
    const float *row = x0 + t * in->stride;
    if (in->cos.obj)
        in->rotary(row, out, (const float *)in->cos.buf + t * in->half, (const float *)in->sin.buf + t * in->half,
                   in->width / head_dim, head_dim, in->half);
    else
        memcpy(out, row, (size_t)in->width * sizeof(float));
}

struct prepare_job {
    const struct encoder_input *in;
    Py_ssize_t tokens, head_dim;
};

static void prepare_task(void *ctx, Py_ssize_t index, int slot)
{
    const struct prepare_job *job = ctx;
    const struct encoder_input *in = job->in;
    const Py_ssize_t end = (index + 1) * PREPARE_TOKENS < job->tokens ? (index + 1) * PREPARE_TOKENS : job->tokens;
    for (Py_ssize_t t = index * PREPARE_TOKENS; t < end; t++) {
        if (in->queries) rotate_or_copy(in, in->q0, t, in->queries + t * in->width, job->head_dim);
        if (in->keys) rotate_or_copy(in, in->k0, t, in->keys + t * in->width, job->head_dim);
    }
    (void)slot;
}

void encoder_input_prepare(struct encoder_input *in, Py_ssize_t tokens, Py_ssize_t head_dim, int threads)
{
    if (in->queries == NULL && in->keys == NULL) return;
    struct prepare_job job = {in, tokens, head_dim};
    fd_parallel_for((tokens + PREPARE_TOKENS - 1) / PREPARE_TOKENS, threads, prepare_task, &job);
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

/* encoder_attention(q, k, v, (q, k, v offsets), stride, cos or None, sin or None, out, cu_seqlens, tokens, heads,
 * head_dim, scale, isa, threads): q/k/v [tokens][stride] float32 whose heads * head_dim floats from each offset
 * are the token's heads (three arrays, or one fused projection three times); cos/sin [tokens][half] rotate q and
 * k (rotate-half); out [tokens, heads, head_dim]; tokens cu_seqlens[i]..cu_seqlens[i+1] attend to each other. */
PyObject *native_encoder_attention(PyObject *self, PyObject *args)
{
    PyObject *objects[5];
    Py_ssize_t offsets[3], stride;
    Py_buffer out, cu;
    Py_ssize_t tokens, heads, head_dim;
    double scale;
    const char *isa_str;
    int threads;
    if (!PyArg_ParseTuple(args, "OOO(nnn)nOOw*y*nnndsi", &objects[0], &objects[1], &objects[2], &offsets[0],
                          &offsets[1], &offsets[2], &stride, &objects[3], &objects[4], &out, &cu, &tokens, &heads,
                          &head_dim, &scale, &isa_str, &threads))
        return NULL;
    PyObject *result = NULL;
    struct encoder_plan plan = {0};
    struct encoder_input in = {0};
    float *keys_t = NULL, *values = NULL;
    const struct row_kernels *kernels = native_row_kernels(isa_str);
    if (kernels == NULL) goto done;
    if (encoder_input_get(&in, objects, offsets, stride, tokens, heads, head_dim, kernels->rotary_row,
                          "encoder_attention") < 0)
        goto done;
    const Py_ssize_t segments = cu.len / (Py_ssize_t)sizeof(int64_t) - 1;
    const int64_t *starts = cu.buf;
    if (out.len != tokens * heads * head_dim * (Py_ssize_t)sizeof(float) ||
        !encoder_segments_valid(starts, segments, tokens)) {
        PyErr_SetString(PyExc_ValueError,
                        "encoder_attention: out does not match the shapes, or cu_seqlens is not 0 .. tokens ascending");
        goto done;
    }
    if (encoder_plan_build(&plan, starts, segments, heads, head_dim, padded_length) < 0) goto no_memory;
    /* zeroed: the padding past a segment's keys is read (and its scores dropped) by the score loop */
    keys_t = PyMem_RawCalloc((size_t)(plan.laid_out > 0 ? plan.laid_out : 1), sizeof(float));
    values = PyMem_RawMalloc((size_t)(plan.laid_out > 0 ? plan.laid_out : 1) * sizeof(float));
    if (keys_t == NULL || values == NULL) goto no_memory;
    struct encoder_job job = {
        .kernel = head_dim == 64 ? kernels->encoder_attend_d64 : kernels->encoder_attend_any,
        .items = plan.items, .in = &in, .out = out.buf, .keys_t = keys_t, .values = values,
        .starts = starts, .offsets = plan.offsets, .heads = heads, .head_dim = head_dim, .longest = plan.longest,
        .scale = (float)scale,
    };
    Py_BEGIN_ALLOW_THREADS
    encoder_input_prepare(&in, tokens, head_dim, threads);
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
    encoder_input_release(&in);
    PyMem_RawFree(keys_t);
    PyMem_RawFree(values);
    PyBuffer_Release(&out);
    PyBuffer_Release(&cu);
    return result;
}
