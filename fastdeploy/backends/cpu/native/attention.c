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
    struct paged_attention call;
    void (*kernel)(ATTEND_ARGS);
    struct attn_item *items;
    Py_ssize_t count, longest;
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
static void store_vector(const struct paged_attention *job, char *cache, float *scales, Py_ssize_t index,
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
    const struct paged_attention *job = &((struct attention_job *)ctx)->call;
    const Py_ssize_t head_dim = job->head_dim, block_size = job->block_size, kv_heads = job->kv_heads;
    const Py_ssize_t end = (index + 1) * KV_WRITES_PER_TASK < job->tokens * kv_heads ? (index + 1) * KV_WRITES_PER_TASK
                                                                                     : job->tokens * kv_heads;
    for (Py_ssize_t w = index * KV_WRITES_PER_TASK; w < end; w++) {
        const Py_ssize_t t = w / kv_heads, h = w % kv_heads;
        const Py_ssize_t block = job->slot_mapping[t] / block_size, offset = job->slot_mapping[t] % block_size;
        const Py_ssize_t position = (block * kv_heads + h) * block_size + offset;
        store_vector(job, job->key_cache, job->key_scales, (block * kv_heads + h) * head_dim * block_size + offset,
                     block_size, position, job->k + t * job->k_stride + h * head_dim);
        store_vector(job, job->value_cache, job->value_scales, position * head_dim, 1, position,
                     job->v + t * job->v_stride + h * head_dim);
    }
    (void)slot;
}

static void attend_task(void *ctx, Py_ssize_t index, int slot)
{
    struct attention_job *job = ctx;
    const struct paged_attention *c = &job->call;
    float *scratch = fd_thread_scratch((size_t)HEADS_AT_ONCE * (size_t)(c->head_dim + job->longest) * sizeof(float));
    if (scratch == NULL) {
        job->out_of_memory = 1;
        return;
    }
    job->kernel(&job->items[index], c->q, c->out, c->key_cache, c->value_cache, c->key_scales, c->value_scales,
                c->query_starts, c->context_lens, c->block_tables, c->width, c->block_size, c->heads, c->kv_heads,
                c->head_dim, c->scale, scratch, scratch + HEADS_AT_ONCE * c->head_dim, job->longest);
    (void)slot;
}

struct attention_job *paged_attention_plan(const struct paged_attention *call, const struct row_kernels *kernels)
{
    const struct paged_attention *c = call;
    if (c->kv_type < 0 || c->kv_type >= KV_TYPES) {
        PyErr_Format(PyExc_ValueError, "attention: unknown KV-cache type %d", c->kv_type);
        return NULL;
    }
    const Py_ssize_t element = KV_BYTES[c->kv_type];
    const Py_ssize_t row_bytes = c->kv_heads * c->head_dim * element;
    const Py_ssize_t slots = c->kv_heads > 0 && c->head_dim > 0 ? c->cache_bytes / row_bytes : 0;
    const Py_ssize_t scale_bytes = c->kv_type == KV_I8 ? slots * c->kv_heads * (Py_ssize_t)sizeof(float) : 0;
    if (c->kv_heads <= 0 || c->heads % c->kv_heads != 0 || c->head_dim <= 0 || c->block_size <= 0 ||
        c->cache_bytes % row_bytes != 0 || c->scale_bytes != scale_bytes || c->seqs < 0 || c->tokens < 0) {
        PyErr_SetString(PyExc_ValueError, "attention: buffer sizes do not match the given shapes");
        return NULL;
    }
    Py_ssize_t longest = 1, count = 0;
    for (Py_ssize_t s = 0; s < c->seqs; s++) {
        const int64_t queries = c->query_starts[s + 1] - c->query_starts[s];
        const Py_ssize_t blocks = (c->context_lens[s] + c->block_size - 1) / c->block_size;
        int bad = queries < 0 || queries > c->context_lens[s] || c->query_starts[s + 1] > c->tokens || blocks > c->width;
        for (Py_ssize_t b = 0; !bad && b < blocks; b++) {
            const int64_t block = c->block_tables[s * c->width + b];
            bad = block < 0 || (block + 1) * c->block_size > slots;
        }
        if (bad) {
            PyErr_SetString(PyExc_ValueError,
                            "attention: query_starts/context_lens/block_tables disagree with each other or the cache");
            return NULL;
        }
        longest = c->context_lens[s] > longest ? c->context_lens[s] : longest;
        count += (queries + ATTN_TILE - 1) / ATTN_TILE * c->kv_heads;
    }
    for (Py_ssize_t t = 0; t < c->tokens; t++)
        if (c->slot_mapping[t] < 0 || c->slot_mapping[t] >= slots) {
            PyErr_Format(PyExc_ValueError, "attention: slot %lld of token %zd is outside the cache",
                         (long long)c->slot_mapping[t], t);
            return NULL;
        }
    struct attention_job *job = PyMem_RawCalloc(1, sizeof(*job));
    struct attn_item *items = PyMem_RawMalloc((size_t)(count > 0 ? count : 1) * sizeof(struct attn_item));
    if (job == NULL || items == NULL) {
        PyMem_RawFree(job);
        PyMem_RawFree(items);
        PyErr_NoMemory();
        return NULL;
    }
    /* each sequence's tiles last to first: the threads claim items in order, and a causal prefill's
     * later tiles see more positions, so its heaviest go first and the lightest last (in token
     * order one thread ran the heaviest alone: 1.3% of a 512-token prefill's attention, two threads) */
    Py_ssize_t n = 0;
    for (Py_ssize_t s = 0; s < c->seqs; s++) {
        const int64_t queries = c->query_starts[s + 1] - c->query_starts[s];
        for (int64_t tile = (queries + ATTN_TILE - 1) / ATTN_TILE - 1; tile >= 0; tile--)
            for (Py_ssize_t h = 0; h < c->kv_heads; h++) {
                const int64_t t0 = c->query_starts[s] + tile * ATTN_TILE, left = c->query_starts[s + 1] - t0;
                items[n++] = (struct attn_item){s, h, t0, left < ATTN_TILE ? left : ATTN_TILE, c->window, c->softcap};
            }
    }
    job->call = *c;
    if (c->kv_type != KV_I8) job->call.key_scales = job->call.value_scales = NULL;
    job->kernel = kernels->attend[c->kv_type][c->head_dim == 64 ? 0 : c->head_dim == 128 ? 1 : 2];
    job->items = items;
    job->count = count;
    job->longest = longest;
    return job;
}

int paged_attention_run(struct attention_job *job, int threads)
{
    /* the new keys and values first (strided key stores miss the cache; several threads overlap
     * the misses), then attention, once every position is written */
    const Py_ssize_t writes = job->call.tokens * job->call.kv_heads;
    fd_parallel_for((writes + KV_WRITES_PER_TASK - 1) / KV_WRITES_PER_TASK, threads, write_kv_task, job);
    fd_parallel_for(job->count, threads, attend_task, job);
    return job->out_of_memory ? -1 : 0;
}

void paged_attention_free(struct attention_job *job)
{
    if (job != NULL) PyMem_RawFree(job->items);
    PyMem_RawFree(job);
}

/* attention(q, k, v, slot_mapping, key_cache, value_cache, key_scales, value_scales, out, query_starts,
 *           context_lens, block_tables, tokens, heads, kv_heads, head_dim, block_size, table_width, scale,
 *           kv_type, isa, threads[, window[, softcap]])
 * First writes each token's k/v [tokens, kv_heads, head_dim] to its cache slot, then attends.
 * q/out [tokens, heads, head_dim]; key_cache [blocks, kv_heads, head_dim, block_size]; value_cache
 * [blocks, kv_heads, block_size, head_dim] (one kv head's block is contiguous), of element type
 * kv_type (enum kv_type); for int8, key/value_scales [blocks, kv_heads, block_size] float32 (else
 * empty); sequence s owns token rows query_starts[s]..query_starts[s+1], the last of its
 * context_lens[s] positions (causal); window > 0: each query sees only its last `window` positions;
 * softcap > 0: scores become softcap * tanh(score / softcap) before the softmax. */
PyObject *native_attention(PyObject *self, PyObject *args)
{
    Py_buffer q, k, v, slot_mapping, kc, vc, ks, vs, out, starts, lens, tables;
    Py_ssize_t tokens, heads, kv_heads, head_dim, block_size, width;
    double scale;
    const char *isa_str;
    int kv_type, threads;
    Py_ssize_t window = 0;
    double softcap = 0.0;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*w*w*w*y*y*y*nnnnnndisi|nd", &q, &k, &v, &slot_mapping, &kc, &vc, &ks, &vs,
                          &out, &starts, &lens, &tables, &tokens, &heads, &kv_heads, &head_dim, &block_size, &width,
                          &scale, &kv_type, &isa_str, &threads, &window, &softcap))
        return NULL;
    PyObject *result = NULL;
    struct attention_job *job = NULL;
    const struct row_kernels *kernels = native_row_kernels(isa_str);
    if (kernels == NULL) goto done;
    const Py_ssize_t seqs = lens.len / (Py_ssize_t)sizeof(int64_t);
    const Py_ssize_t row = heads * head_dim * (Py_ssize_t)sizeof(float);
    if (q.len != tokens * row || out.len != q.len || starts.len != (seqs + 1) * (Py_ssize_t)sizeof(int64_t) ||
        tables.len != seqs * width * (Py_ssize_t)sizeof(int64_t) || kc.len != vc.len || ks.len != vs.len ||
        k.len != tokens * kv_heads * head_dim * (Py_ssize_t)sizeof(float) || v.len != k.len ||
        slot_mapping.len != tokens * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "attention: buffer sizes do not match the given shapes");
        goto done;
    }
    const struct paged_attention call = {
        .q = q.buf, .k = k.buf, .v = v.buf, .k_stride = kv_heads * head_dim, .v_stride = kv_heads * head_dim, .out = out.buf,
        .key_cache = kc.buf, .value_cache = vc.buf, .key_scales = ks.buf, .value_scales = vs.buf,
        .cache_bytes = kc.len, .scale_bytes = ks.len, .slot_mapping = slot_mapping.buf, .query_starts = starts.buf,
        .context_lens = lens.buf, .block_tables = tables.buf, .seqs = seqs, .tokens = tokens, .heads = heads,
        .kv_heads = kv_heads, .head_dim = head_dim, .block_size = block_size, .width = width,
        .scale = (float)scale, .kv_type = kv_type, .window = window > 0 ? window : 0,
        .softcap = softcap > 0.0 ? (float)softcap : 0.0f,
    };
    job = paged_attention_plan(&call, kernels);
    if (job == NULL) goto done;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = paged_attention_run(job, threads);
    Py_END_ALLOW_THREADS
    result = failed ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    paged_attention_free(job);
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
