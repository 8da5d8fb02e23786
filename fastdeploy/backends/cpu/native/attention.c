/*
 * Paged causal attention on the cpu backend's caches (layouts in the comment below).
 */
#include "native.h"

#include <stdlib.h>
#include <string.h>

/* Attention work is split into items: one kv head of one sequence for up to ATTN_TILE of its
 * query tokens. Keys are cached transposed per block ([blocks, kv_heads, head_dim, block_size]),
 * so scores for a run of positions come from broadcasting one query element at a time (vectorised
 * over positions, no horizontal sums). Values are cached [blocks, kv_heads, block_size, head_dim]. Each
 * query head takes a softmax (normalised like numpy's) and its probability-weighted values. */
#define ATTN_TILE 32
#define ATTN_CHUNK 64 /* positions scored at once when the block size allows; kept in registers */

struct attn_item {
    Py_ssize_t seq, kv_head, token0, tokens;
};

#define MAX_VECTORS_PER_HEAD 8 /* head_dim up to 128 on the vector path */

/* Up to HEADS_AT_ONCE query heads of one kv group go through each key and value row together:
 * the row is loaded once, and their accumulators are independent chains that keep the FMA units
 * busy. `heads_now` is a constant in every inlined copy. */
#define HEADS_AT_ONCE 4

/* scores[h][j] = q_h . key_j for the `count` positions of one cached key block ([head_dim][block_size]);
 * q_scaled [heads_now][head_dim], scores rows `stride` apart. */
static inline __attribute__((always_inline)) void
score_block(const float *q_scaled, int heads_now, const float *keys_t, Py_ssize_t block_size, Py_ssize_t count,
            const Py_ssize_t head_dim, float *scores, Py_ssize_t stride)
{
    if (block_size % ATTN_CHUNK == 0) {
        for (Py_ssize_t c = 0; c < count; c += ATTN_CHUNK) {
            v16f acc[HEADS_AT_ONCE][ATTN_CHUNK / 16] = {{{0}}};
            for (Py_ssize_t d = 0; d < head_dim; d++) {
                const v16f *row = (const v16f *)(keys_t + d * block_size + c);
#pragma GCC unroll 4
                for (int i = 0; i < ATTN_CHUNK / 16; i++) {
                    const v16f keys = row[i];
                    for (int h = 0; h < heads_now; h++) acc[h][i] += q_scaled[h * head_dim + d] * keys;
                }
            }
            const Py_ssize_t n = count - c < ATTN_CHUNK ? count - c : ATTN_CHUNK;
            for (int h = 0; h < heads_now; h++) {
                float chunk[ATTN_CHUNK];
                memcpy(chunk, acc[h], sizeof(chunk));
                memcpy(scores + h * stride + c, chunk, (size_t)n * sizeof(float));
            }
        }
        return;
    }
    for (int h = 0; h < heads_now; h++) {
        float *row_scores = scores + h * stride;
        for (Py_ssize_t j = 0; j < count; j++) row_scores[j] = 0.0f;
        for (Py_ssize_t d = 0; d < head_dim; d++) {
            const float qd = q_scaled[h * head_dim + d];
            const float *row = keys_t + d * block_size;
#pragma omp simd
            for (Py_ssize_t j = 0; j < count; j++) row_scores[j] += qd * row[j];
        }
    }
}

/* out_h = sum over the first `visible` positions of probs[h][j] * value_j (values cached per block);
 * probs rows `stride` apart, out rows head_dim apart. */
static inline __attribute__((always_inline)) void
weighted_values(const float *probs, int heads_now, Py_ssize_t stride, Py_ssize_t visible, const float *value_cache,
                const int64_t *table, Py_ssize_t block_size, Py_ssize_t num_kv_heads, Py_ssize_t kv_head,
                const Py_ssize_t head_dim, float *out)
{
    const Py_ssize_t block_floats = head_dim * block_size;
    if (head_dim % 16 == 0 && head_dim / 16 <= MAX_VECTORS_PER_HEAD) {
        v16f acc[HEADS_AT_ONCE][MAX_VECTORS_PER_HEAD] = {{{0}}};
        for (Py_ssize_t first = 0; first < visible; first += block_size) {
            const float *values = value_cache + (table[first / block_size] * num_kv_heads + kv_head) * block_floats;
            const Py_ssize_t count = visible - first < block_size ? visible - first : block_size;
            for (Py_ssize_t j = 0; j < count; j++) {
                const v16f *value = (const v16f *)(values + j * head_dim);
#pragma GCC unroll 8
                for (int i = 0; i < head_dim / 16; i++) {
                    const v16f v = value[i];
                    for (int h = 0; h < heads_now; h++) acc[h][i] += probs[h * stride + first + j] * v;
                }
            }
        }
        for (int h = 0; h < heads_now; h++)
            for (int i = 0; i < head_dim / 16; i++) memcpy(out + h * head_dim + 16 * i, &acc[h][i], sizeof(v16f));
        return;
    }
    for (int h = 0; h < heads_now; h++) {
        float *oh = out + h * head_dim;
        for (Py_ssize_t d = 0; d < head_dim; d++) oh[d] = 0.0f;
        for (Py_ssize_t first = 0; first < visible; first += block_size) {
            const float *values = value_cache + (table[first / block_size] * num_kv_heads + kv_head) * block_floats;
            const Py_ssize_t count = visible - first < block_size ? visible - first : block_size;
            for (Py_ssize_t j = 0; j < count; j++) {
                const float p = probs[h * stride + first + j];
#pragma omp simd
                for (Py_ssize_t d = 0; d < head_dim; d++) oh[d] += p * values[j * head_dim + d];
            }
        }
    }
}

/* In place: each of the rows becomes the softmax of its first `visible` scores (numpy's order:
 * subtract the maximum, exponentiate, divide by the sum). */
static inline __attribute__((always_inline)) void softmax_rows(float *scores, int rows, Py_ssize_t stride,
                                                               Py_ssize_t visible)
{
    for (int h = 0; h < rows; h++) {
        float *row = scores + h * stride;
        float peak = row[0], total = 0.0f;
#pragma omp simd reduction(max : peak)
        for (Py_ssize_t j = 0; j < visible; j++) peak = row[j] > peak ? row[j] : peak;
#pragma omp simd reduction(+ : total)
        for (Py_ssize_t j = 0; j < visible; j++) {
            row[j] = exp_f32(row[j] - peak);
            total += row[j];
        }
        const float inverse = 1.0f / total;
#pragma omp simd
        for (Py_ssize_t j = 0; j < visible; j++) row[j] *= inverse;
    }
}

/* One token's `heads_now` query heads starting at `offset` (same kv head): scores, softmax, values. */
static inline __attribute__((always_inline)) void
attend_heads(const float *q, float *out, Py_ssize_t offset, int heads_now, Py_ssize_t visible, const float *key_cache,
             const float *value_cache, const int64_t *table, Py_ssize_t block_size, Py_ssize_t num_kv_heads,
             Py_ssize_t kv_head, const Py_ssize_t head_dim, float scale, float *q_scaled, float *scores,
             Py_ssize_t stride)
{
    for (Py_ssize_t i = 0; i < heads_now * head_dim; i++) q_scaled[i] = q[offset + i] * scale;
    for (Py_ssize_t first = 0; first < visible; first += block_size) {
        const float *keys_t = key_cache + (table[first / block_size] * num_kv_heads + kv_head) * head_dim * block_size;
        const Py_ssize_t count = visible - first < block_size ? visible - first : block_size;
        score_block(q_scaled, heads_now, keys_t, block_size, count, head_dim, scores + first, stride);
    }
    softmax_rows(scores, heads_now, stride, visible);
    weighted_values(scores, heads_now, stride, visible, value_cache, table, block_size, num_kv_heads, kv_head,
                    head_dim, out + offset);
}

/* `scores` holds HEADS_AT_ONCE rows of `stride` floats; `q_scaled` HEADS_AT_ONCE * head_dim. */
static inline __attribute__((always_inline)) void
attend_item(const struct attn_item *item, const float *q, float *out, const float *key_cache, const float *value_cache,
            const int64_t *query_starts, const int64_t *context_lens, const int64_t *block_tables, Py_ssize_t width,
            Py_ssize_t block_size, Py_ssize_t heads, Py_ssize_t num_kv_heads, const Py_ssize_t head_dim, float scale,
            float *q_scaled, float *scores, Py_ssize_t stride)
{
    const Py_ssize_t group = heads / num_kv_heads, s = item->seq;
    const int64_t *table = block_tables + s * width;
    /* positions visible to the item's first token; each later token sees one more */
    const Py_ssize_t first_visible = context_lens[s] - (query_starts[s + 1] - item->token0) + 1;
    for (Py_ssize_t t = 0; t < item->tokens; t++) {
        for (Py_ssize_t g = 0; g < group; g += HEADS_AT_ONCE) {
            const Py_ssize_t offset = (item->token0 + t) * heads * head_dim + (item->kv_head * group + g) * head_dim;
#define ATTEND_HEADS(n)                                                                                      \
    attend_heads(q, out, offset, n, first_visible + t, key_cache, value_cache, table, block_size, num_kv_heads, \
                 item->kv_head, head_dim, scale, q_scaled, scores, stride)
            switch (group - g < HEADS_AT_ONCE ? (int)(group - g) : HEADS_AT_ONCE) {
            case 1: ATTEND_HEADS(1); break;
            case 2: ATTEND_HEADS(2); break;
            case 3: ATTEND_HEADS(3); break;
            default: ATTEND_HEADS(HEADS_AT_ONCE); break;
            }
#undef ATTEND_HEADS
        }
    }
}

#define ATTEND_ARGS                                                                                             \
    const struct attn_item *item, const float *q, float *out, const float *key_cache, const float *value_cache, \
        const int64_t *query_starts, const int64_t *context_lens, const int64_t *block_tables, Py_ssize_t width,  \
        Py_ssize_t block_size, Py_ssize_t heads, Py_ssize_t num_kv_heads, Py_ssize_t head_dim, float scale,       \
        float *q_scaled, float *scores, Py_ssize_t stride
#define ATTEND_PASS(dim)                                                                                         \
    attend_item(item, q, out, key_cache, value_cache, query_starts, context_lens, block_tables, width, block_size, \
                heads, num_kv_heads, dim, scale, q_scaled, scores, stride)

/* one clone set per common head size, so the compiler unrolls the head_dim loops */
static CLONES void attend_item_d64(ATTEND_ARGS) { (void)head_dim; ATTEND_PASS(64); }
static CLONES void attend_item_d128(ATTEND_ARGS) { (void)head_dim; ATTEND_PASS(128); }
static CLONES void attend_item_any(ATTEND_ARGS) { ATTEND_PASS(head_dim); }

/* attention(q, k, v, slot_mapping, key_cache, value_cache, out, query_starts, context_lens,
 *           block_tables, tokens, heads, kv_heads, head_dim, block_size, table_width, scale, threads)
 * First writes each token's k/v [tokens, kv_heads, head_dim] to its cache slot, then attends.
 * q/out [tokens, heads, head_dim]; key_cache [blocks, kv_heads, head_dim, block_size]; value_cache
 * [blocks, kv_heads, block_size, head_dim] (one kv head's block is contiguous); sequence s owns token rows
 * query_starts[s]..query_starts[s+1], the last of its context_lens[s] positions (causal). */
PyObject *native_attention(PyObject *self, PyObject *args)
{
    Py_buffer q, k, v, slot_mapping, kc, vc, out, starts, lens, tables;
    Py_ssize_t tokens, heads, kv_heads, head_dim, block_size, width;
    double scale;
    int threads;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*w*y*y*y*nnnnnndi", &q, &k, &v, &slot_mapping, &kc, &vc, &out, &starts,
                          &lens, &tables, &tokens, &heads, &kv_heads, &head_dim, &block_size, &width, &scale,
                          &threads))
        return NULL;
    PyObject *result = NULL;
    struct attn_item *items = NULL;
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
    void (*attend)(ATTEND_ARGS) = head_dim == 64 ? attend_item_d64 : head_dim == 128 ? attend_item_d128 : attend_item_any;
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
