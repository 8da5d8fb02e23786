/*
 * Paged causal attention: the Python entry point. It writes the step's keys and values, splits the
 * work into items and runs them on the instruction set's row kernels (row_kernels.h).
 */
#include "native.h"

#include <stdlib.h>
#include <string.h>

#define ATTN_TILE 32 /* query tokens of one sequence per work item */

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
    void (*attend)(ATTEND_ARGS) =
        head_dim == 64 ? kernels->attend_d64 : head_dim == 128 ? kernels->attend_d128 : kernels->attend_any;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (count > 1 || tokens > 1)
    {
        float *scratch = malloc((size_t)HEADS_AT_ONCE * (size_t)(head_dim + longest) * sizeof(float));
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        /* the new keys and values first (strided key stores miss the cache; several threads overlap
         * the misses), then attention, after the loop's barrier, when every position is written */
#pragma omp for schedule(static)
        for (Py_ssize_t w = 0; w < tokens * kv_heads; w++) {
            const Py_ssize_t t = w / kv_heads, h = w % kv_heads;
            const Py_ssize_t block = slot_of[t] / block_size, offset = slot_of[t] % block_size;
            const float *key = (const float *)k.buf + w * head_dim, *value = (const float *)v.buf + w * head_dim;
            float *keys_t = (float *)kc.buf + (block * kv_heads + h) * head_dim * block_size + offset;
            for (Py_ssize_t d = 0; d < head_dim; d++) keys_t[d * block_size] = key[d];
            memcpy((float *)vc.buf + ((block * kv_heads + h) * block_size + offset) * head_dim, value,
                   (size_t)head_dim * sizeof(float));
        }
#pragma omp for schedule(dynamic, 1)
        for (Py_ssize_t i = 0; i < count; i++) {
            if (scratch != NULL)
                attend(&items[i], q.buf, out.buf, kc.buf, vc.buf, query_starts, context_lens, block_tables, width,
                       block_size, heads, kv_heads, head_dim, (float)scale, scratch, scratch + HEADS_AT_ONCE * head_dim,
                       longest);
        }
        free(scratch);
    }
    Py_END_ALLOW_THREADS
    if (failed)
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
