/*
 * Paged causal attention: the Python entry point. It writes the step's keys and values, splits the
 * work into items and runs them on the instruction set's row kernels (row_kernels.h).
 */
#include "native.h"

#include <stdatomic.h>
#include <string.h>

#define ATTN_TILE 32           /* query tokens of one sequence per work item */
#define KV_WRITES_PER_TASK 64 /* (token, kv head) rows written to the cache per task */

struct attention_job {
    void (*kernel)(ATTEND_ARGS);
    const struct attn_item *items;
    const float *q, *k, *v;
    float *out, *key_cache, *value_cache;
    const int64_t *slot_of, *query_starts, *context_lens, *block_tables;
    Py_ssize_t tokens, width, block_size, heads, kv_heads, head_dim, longest;
    float scale;
    _Atomic int out_of_memory;
};

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
        const float *key = job->k + w * head_dim, *value = job->v + w * head_dim;
        float *keys_t = job->key_cache + (block * kv_heads + h) * head_dim * block_size + offset;
        for (Py_ssize_t d = 0; d < head_dim; d++) keys_t[d * block_size] = key[d];
        memcpy(job->value_cache + ((block * kv_heads + h) * block_size + offset) * head_dim, value,
               (size_t)head_dim * sizeof(float));
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
    job->kernel(&job->items[index], job->q, job->out, job->key_cache, job->value_cache, job->query_starts,
                job->context_lens, job->block_tables, job->width, job->block_size, job->heads, job->kv_heads,
                job->head_dim, job->scale, scratch, scratch + HEADS_AT_ONCE * job->head_dim, job->longest);
    (void)slot;
}

/* attention(q, k, v, slot_mapping, key_cache, value_cache, out, query_starts, context_lens,
 *           block_tables, tokens, heads, kv_heads, head_dim, block_size, table_width, scale, isa, threads)
 * First writes each token's k/v [tokens, kv_heads, head_dim] to its cache slot, then attends.
 * q/out [tokens, heads, head_dim]; key_cache [blocks, kv_heads, head_dim, block_size]; value_cache
 * [blocks, kv_heads, block_size, head_dim] (one kv head's block is contiguous); sequence s owns token rows
 * query_starts[s]..query_starts[s+1], the last of its context_lens[s] positions (causal). */
PyObject *native_attention(PyObject *self, PyObject *args)
{
    Py_buffer q, k, v, slot_mapping, kc, vc, out, starts, lens, tables;
    Py_ssize_t tokens, heads, kv_heads, head_dim, block_size, width;
    double scale;
    const char *isa_str;
    int threads;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*w*y*y*y*nnnnnndsi", &q, &k, &v, &slot_mapping, &kc, &vc, &out, &starts,
                          &lens, &tables, &tokens, &heads, &kv_heads, &head_dim, &block_size, &width, &scale,
                          &isa_str, &threads))
        return NULL;
    PyObject *result = NULL;
    struct attn_item *items = NULL;
    const struct row_kernels *kernels = native_row_kernels(isa_str);
    if (kernels == NULL) goto done;
    const Py_ssize_t seqs = lens.len / (Py_ssize_t)sizeof(int64_t);
    const Py_ssize_t row = heads * head_dim * (Py_ssize_t)sizeof(float);
    if (kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0 || block_size <= 0 || q.len != tokens * row ||
        out.len != q.len || starts.len != (seqs + 1) * (Py_ssize_t)sizeof(int64_t) ||
        tables.len != seqs * width * (Py_ssize_t)sizeof(int64_t) || kc.len != vc.len ||
        kc.len % (kv_heads * head_dim * (Py_ssize_t)sizeof(float)) != 0 ||
        k.len != tokens * kv_heads * head_dim * (Py_ssize_t)sizeof(float) || v.len != k.len ||
        slot_mapping.len != tokens * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "attention: buffer sizes do not match the given shapes");
        goto done;
    }
    const int64_t *query_starts = starts.buf, *context_lens = lens.buf, *block_tables = tables.buf;
    const Py_ssize_t slots = kc.len / (kv_heads * head_dim * (Py_ssize_t)sizeof(float));
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
        .kernel = head_dim == 64 ? kernels->attend_d64 : head_dim == 128 ? kernels->attend_d128 : kernels->attend_any,
        .items = items, .q = q.buf, .k = k.buf, .v = v.buf, .out = out.buf, .key_cache = kc.buf,
        .value_cache = vc.buf, .slot_of = slot_mapping.buf, .query_starts = query_starts,
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
    PyBuffer_Release(&out);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&tables);
    return result;
}
