/*
 * Paged causal attention: the Python entry point. It writes the step's keys and values into the
 * cache in its element type (float32, float16, bfloat16, or int8 with a scale per position and kv
 * head), splits the work into items and runs them on the instruction set's row kernels
 * (row_kernels.h, attention_kernels.h).
 */
#include "native.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define ATTN_TILE 32           /* query tokens of one sequence per work item */
#define KV_WRITES_PER_TASK 64 /* (token, kv head) rows written to the cache per task */

struct attention_job {
    void (*kernel)(ATTEND_ARGS);
    const struct attn_item *items;
    const float *q, *k, *v;
    float *out, *key_scales, *value_scales;
    char *key_cache, *value_cache;
    int kv_type;
    const int64_t *slot_of, *query_starts, *context_lens, *block_tables;
    Py_ssize_t tokens, width, block_size, heads, kv_heads, head_dim, longest;
    float scale;
    _Atomic int out_of_memory;
};

static const Py_ssize_t KV_BYTES[KV_TYPES] = {4, 2, 2, 1};

/* float32 -> float16, rounded to nearest even (GCC's _Float16 conversion). */
static uint16_t to_f16(float x)
{
    const _Float16 h = (_Float16)x;
    uint16_t bits;
    memcpy(&bits, &h, sizeof(bits));
    return bits;
}

/* float32 -> bfloat16, rounded to nearest even; NaN stays a (quiet) NaN. */
static uint16_t to_bf16(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/* Writes one kv head's vector `x` into the cache at element `index`, `stride` elements apart (keys are
 * transposed: stride block_size; values: 1); int8 also writes its scale (max|x| / 127). */
static void store_vector(const struct attention_job *job, char *cache, float *scales, Py_ssize_t index,
                         Py_ssize_t stride, Py_ssize_t scale_index, const float *x)
{
    const Py_ssize_t n = job->head_dim;
    switch (job->kv_type) {
    case KV_F32:
        for (Py_ssize_t d = 0; d < n; d++) ((float *)cache)[index + d * stride] = x[d];
        break;
    case KV_F16:
        for (Py_ssize_t d = 0; d < n; d++) ((uint16_t *)cache)[index + d * stride] = to_f16(x[d]);
        break;
    case KV_BF16:
        for (Py_ssize_t d = 0; d < n; d++) ((uint16_t *)cache)[index + d * stride] = to_bf16(x[d]);
        break;
    default: {
        float peak = 0.0f;
        for (Py_ssize_t d = 0; d < n; d++) peak = fmaxf(peak, fabsf(x[d]));
        const float inverse = peak > 0.0f ? 127.0f / peak : 0.0f;
        for (Py_ssize_t d = 0; d < n; d++) {
            const float q = nearbyintf(x[d] * inverse);
            ((int8_t *)cache)[index + d * stride] = (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
        }
        scales[scale_index] = peak / 127.0f;
    }
    }
}

/* Rows index * KV_WRITES_PER_TASK.. of the step's keys and values into their cache slots. */
static void write_kv_task(void *ctx, Py_ssize_t index, int slot)
{
    struct attention_job *job = ctx;
    const Py_ssize_t head_dim = job->head_dim, block_size = job->block_size, kv_heads = job->kv_heads;
    const Py_ssize_t end = (index + 1) * KV_WRITES_PER_TASK < job->tokens * kv_heads ? (index + 1) * KV_WRITES_PER_TASK
                                                                                     : job->tokens * kv_heads;
    for (Py_ssize_t w = index * KV_WRITES_PER_TASK; w < end; w++) {
        const Py_ssize_t t = w / kv_heads, h = w % kv_heads;
        const Py_ssize_t block = job->slot_of[t] / block_size, offset = job->slot_of[t] % block_size;
        const Py_ssize_t position = (block * kv_heads + h) * block_size + offset;
        store_vector(job, job->key_cache, job->key_scales, (block * kv_heads + h) * head_dim * block_size + offset,
                     block_size, position, job->k + w * head_dim);
        store_vector(job, job->value_cache, job->value_scales, position * head_dim, 1, position,
                     job->v + w * head_dim);
    }
    (void)slot;
}

static void attend_task(void *ctx, Py_ssize_t index, int slot)
{
    struct attention_job *job = ctx;
    float *scratch = fd_thread_scratch((size_t)HEADS_AT_ONCE * (size_t)(job->head_dim + job->longest) * sizeof(float));
    if (scratch == NULL) {
        job->out_of_memory = 1;
        return;
    }
    job->kernel(&job->items[index], job->q, job->out, job->key_cache, job->value_cache, job->key_scales,
                job->value_scales, job->query_starts,
                job->context_lens, job->block_tables, job->width, job->block_size, job->heads, job->kv_heads,
                job->head_dim, job->scale, scratch, scratch + HEADS_AT_ONCE * job->head_dim, job->longest);
    (void)slot;
}

/* attention(q, k, v, slot_mapping, key_cache, value_cache, key_scales, value_scales, out, query_starts,
 *           context_lens, block_tables, tokens, heads, kv_heads, head_dim, block_size, table_width, scale,
 *           kv_type, isa, threads)
 * First writes each token's k/v [tokens, kv_heads, head_dim] to its cache slot, then attends.
 * q/out [tokens, heads, head_dim]; key_cache [blocks, kv_heads, head_dim, block_size]; value_cache
 * [blocks, kv_heads, block_size, head_dim] (one kv head's block is contiguous), of element type
 * kv_type (enum kv_type); for int8, key/value_scales [blocks, kv_heads, block_size] float32 (else
 * empty); sequence s owns token rows query_starts[s]..query_starts[s+1], the last of its
 * context_lens[s] positions (causal). */
PyObject *native_attention(PyObject *self, PyObject *args)
{
    Py_buffer q, k, v, slot_mapping, kc, vc, ks, vs, out, starts, lens, tables;
    Py_ssize_t tokens, heads, kv_heads, head_dim, block_size, width;
    double scale;
    const char *isa_str;
    int kv_type, threads;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*w*w*w*y*y*y*nnnnnndisi", &q, &k, &v, &slot_mapping, &kc, &vc, &ks, &vs,
                          &out, &starts, &lens, &tables, &tokens, &heads, &kv_heads, &head_dim, &block_size, &width,
                          &scale, &kv_type, &isa_str, &threads))
        return NULL;
    PyObject *result = NULL;
    struct attn_item *items = NULL;
    const struct row_kernels *kernels = native_row_kernels(isa_str);
    if (kernels == NULL) goto done;
    const Py_ssize_t seqs = lens.len / (Py_ssize_t)sizeof(int64_t);
    const Py_ssize_t row = heads * head_dim * (Py_ssize_t)sizeof(float);
    if (kv_type < 0 || kv_type >= KV_TYPES) {
        PyErr_Format(PyExc_ValueError, "attention: unknown KV-cache type %d", kv_type);
        goto done;
    }
    const Py_ssize_t element = KV_BYTES[kv_type];
    const Py_ssize_t slots = kv_heads > 0 && head_dim > 0 ? kc.len / (kv_heads * head_dim * element) : 0;
    const Py_ssize_t scale_bytes = kv_type == KV_I8 ? slots * kv_heads * (Py_ssize_t)sizeof(float) : 0;
    if (kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0 || block_size <= 0 || q.len != tokens * row ||
        out.len != q.len || starts.len != (seqs + 1) * (Py_ssize_t)sizeof(int64_t) ||
        tables.len != seqs * width * (Py_ssize_t)sizeof(int64_t) || kc.len != vc.len ||
        kc.len % (kv_heads * head_dim * element) != 0 || ks.len != scale_bytes || vs.len != scale_bytes ||
        k.len != tokens * kv_heads * head_dim * (Py_ssize_t)sizeof(float) || v.len != k.len ||
        slot_mapping.len != tokens * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "attention: buffer sizes do not match the given shapes");
        goto done;
    }
    const int64_t *query_starts = starts.buf, *context_lens = lens.buf, *block_tables = tables.buf;
    Py_ssize_t longest = 1, count = 0;
    for (Py_ssize_t s = 0; s < seqs; s++) {
        const int64_t queries = query_starts[s + 1] - query_starts[s];
        const Py_ssize_t blocks = (context_lens[s] + block_size - 1) / block_size;
        int bad = queries < 0 || queries > context_lens[s] || query_starts[s + 1] > tokens || blocks > width;
        for (Py_ssize_t b = 0; !bad && b < blocks; b++)
            bad = block_tables[s * width + b] < 0 || (block_tables[s * width + b] + 1) * block_size > slots;
        if (bad) {
            PyErr_SetString(PyExc_ValueError,
                            "attention: query_starts/context_lens/block_tables disagree with each other or the cache");
            goto done;
        }
        longest = context_lens[s] > longest ? context_lens[s] : longest;
        count += (queries + ATTN_TILE - 1) / ATTN_TILE * kv_heads;
    }
    items = PyMem_RawMalloc((size_t)(count > 0 ? count : 1) * sizeof(struct attn_item));
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *slot_of = slot_mapping.buf;
    for (Py_ssize_t t = 0; t < tokens; t++)
        if (slot_of[t] < 0 || slot_of[t] >= slots) {
            PyErr_Format(PyExc_ValueError, "attention: slot %lld of token %zd is outside the cache", (long long)slot_of[t], t);
            goto done;
        }
    Py_ssize_t n = 0;
    for (Py_ssize_t s = 0; s < seqs; s++)
        for (int64_t t0 = query_starts[s]; t0 < query_starts[s + 1]; t0 += ATTN_TILE)
            for (Py_ssize_t h = 0; h < kv_heads; h++) {
                const Py_ssize_t left = query_starts[s + 1] - t0;
                items[n++] = (struct attn_item){s, h, t0, left < ATTN_TILE ? left : ATTN_TILE};
            }
    struct attention_job job = {
        .kernel = kernels->attend[kv_type][head_dim == 64 ? 0 : head_dim == 128 ? 1 : 2],
        .items = items, .q = q.buf, .k = k.buf, .v = v.buf, .out = out.buf, .key_cache = kc.buf,
        .value_cache = vc.buf, .key_scales = kv_type == KV_I8 ? ks.buf : NULL,
        .value_scales = kv_type == KV_I8 ? vs.buf : NULL, .kv_type = kv_type,
        .slot_of = slot_mapping.buf, .query_starts = query_starts,
        .context_lens = context_lens, .block_tables = block_tables, .width = width, .block_size = block_size,
        .tokens = tokens, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim, .longest = longest,
        .scale = (float)scale,
    };
    Py_BEGIN_ALLOW_THREADS
    /* the new keys and values first (strided key stores miss the cache; several threads overlap
     * the misses), then attention, once every position is written */
    const Py_ssize_t writes = tokens * kv_heads;
    fd_parallel_for((writes + KV_WRITES_PER_TASK - 1) / KV_WRITES_PER_TASK, threads, write_kv_task, &job);
    fd_parallel_for(count, threads, attend_task, &job);
    Py_END_ALLOW_THREADS
    if (job.out_of_memory)
        PyErr_NoMemory();
    else
        result = Py_NewRef(Py_None);
done:
    PyMem_RawFree(items);
    PyBuffer_Release(&q);
    PyBuffer_Release(&k);
    PyBuffer_Release(&v);
    PyBuffer_Release(&slot_mapping);
    PyBuffer_Release(&kc);
    PyBuffer_Release(&vc);
    PyBuffer_Release(&ks);
    PyBuffer_Release(&vs);
    PyBuffer_Release(&out);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&tables);
    return result;
}
