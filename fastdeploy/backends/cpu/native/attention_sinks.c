/*
 * Attention sinks beside the native paged attention (`Backend.attention_with_sinks`, GPT-OSS).
 *
 * A sink is one more logit per query head in each softmax denominator that weighs no value, so
 * attention with sinks is attention without them times 1 / (1 + exp(sink_h - lse)), lse the
 * log-sum-exp of the query's scaled scores over the positions it sees. This file computes those
 * factors in a second pass over the cached keys (online log-sum-exp, a block of keys widened to
 * float32 at a time, shared by a tile of query tokens), apart from the attention kernels
 * (attention_kernels.h), whose softmax it leaves untouched; the caller multiplies.
 */
#include "native.h"

#include <math.h>
#include <string.h>

#define SINK_TILE 32 /* query tokens of one work item: they share each widened key block */

static const Py_ssize_t KEY_BYTES[KV_TYPES] = {4, 2, 2, 1};

struct sink_item {
    Py_ssize_t seq, kv_head, token0, tokens;
};

struct sink_job {
    const float *q, *sinks, *key_scales;
    const void *key_cache;
    const int64_t *query_starts, *context_lens, *block_tables;
    float *out;
    Py_ssize_t heads, kv_heads, head_dim, block_size, width, window;
    float scale;
    int kv_type;
    struct sink_item *items;
    int out_of_memory;
};

static float bf16_value(uint16_t value)
{
    const uint32_t bits = (uint32_t)value << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static float f16_value(uint16_t half)
{
    const uint32_t sign = (uint32_t)(half & 0x8000u) << 16;
    uint32_t exponent = (half >> 10) & 0x1fu, mantissa = half & 0x3ffu, bits;
    if (exponent == 31) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        exponent = 113;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            exponent--;
        }
        bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* exp(x) for x <= 0 (a score minus its running maximum) in a form the compiler vectorises: 2^n times a
 * degree-6 polynomial of the remainder (|r| <= ln 2 / 2, relative error ~1e-7); below -87, ~0 */
static inline float exp_nonpositive(float x)
{
    x = x < -87.0f ? -87.0f : x;
    const float n = floorf(x * 1.44269504f + 0.5f);
    const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    const float p =
        1.0f + r * (1.0f + r * (0.5f + r * (1.66666667e-1f + r * (4.16666667e-2f + r * (8.33333333e-3f + r * 1.38888889e-3f)))));
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return p * scale;
}

/* keys [head_dim][block_size] float32: the first `count` positions of kv head `h` of cache block `block`
 * ([blocks, kv_heads, head_dim, block_size]; int8 times its scale per position) */
static inline void widen_keys(const struct sink_job *job, int64_t block, Py_ssize_t h, Py_ssize_t count, float *keys)
{
    const Py_ssize_t bs = job->block_size, dim = job->head_dim;
    const Py_ssize_t first = ((Py_ssize_t)block * job->kv_heads + h) * dim * bs;
    for (Py_ssize_t i = 0; i < dim; i++) {
        float *row = keys + i * bs;
        const Py_ssize_t at = first + i * bs;
        switch (job->kv_type) {
        case KV_F32:
            memcpy(row, (const float *)job->key_cache + at, (size_t)count * sizeof(float));
            break;
        case KV_F16:
            for (Py_ssize_t j = 0; j < count; j++) row[j] = f16_value(((const uint16_t *)job->key_cache)[at + j]);
            break;
        case KV_BF16:
            for (Py_ssize_t j = 0; j < count; j++) row[j] = bf16_value(((const uint16_t *)job->key_cache)[at + j]);
            break;
        default: { /* KV_I8 */
            const float *scales = job->key_scales + ((Py_ssize_t)block * job->kv_heads + h) * bs;
            for (Py_ssize_t j = 0; j < count; j++) row[j] = (float)((const int8_t *)job->key_cache)[at + j] * scales[j];
            break;
        }
        }
    }
}

/* one (sequence, kv head, tile of query tokens) item; compiled for AVX-512, AVX2 and the baseline, the
 * loader picking the widest this CPU runs */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
sink_task(void *ctx, Py_ssize_t index, int slot)
{
    struct sink_job *job = ctx;
    const struct sink_item *item = &job->items[index];
    const Py_ssize_t bs = job->block_size, dim = job->head_dim, group = job->heads / job->kv_heads;
    const Py_ssize_t n = item->tokens, rows = n * group, h = item->kv_head, s = item->seq;
    float *keys = fd_thread_scratch(
        ((size_t)dim * (size_t)bs + (size_t)group * (size_t)bs + (size_t)rows * (2 + (size_t)dim)) * sizeof(float));
    if (keys == NULL) {
        job->out_of_memory = 1;
        return;
    }
    float *scores = keys + dim * bs, *peak = scores + group * bs, *total = peak + rows, *queries = total + rows;
    for (Py_ssize_t t = 0; t < n; t++)
        for (Py_ssize_t g = 0; g < group; g++) {
            const float *q = job->q + ((item->token0 + t) * job->heads + h * group + g) * dim;
            float *scaled = queries + (t * group + g) * dim;
            for (Py_ssize_t i = 0; i < dim; i++) scaled[i] = q[i] * job->scale;
        }
    for (Py_ssize_t r = 0; r < rows; r++) {
        peak[r] = -INFINITY;
        total[r] = 0.0f;
    }
    const Py_ssize_t length = job->context_lens[s];
    const Py_ssize_t first = length - (job->query_starts[s + 1] - job->query_starts[s]) +
                             (item->token0 - job->query_starts[s]); /* the item's first token's position */
    const Py_ssize_t lowest = job->window > 0 && first + 1 > job->window ? first + 1 - job->window : 0;
    for (Py_ssize_t b = lowest / bs; b * bs < first + n; b++) {
        const Py_ssize_t base = b * bs, count = length - base < bs ? length - base : bs;
        widen_keys(job, job->block_tables[s * job->width + b], h, count, keys);
        for (Py_ssize_t t = 0; t < n; t++) {
            const Py_ssize_t position = first + t;
            const Py_ssize_t seen = job->window > 0 && position + 1 > job->window ? position + 1 - job->window : 0;
            const Py_ssize_t j0 = seen > base ? seen - base : 0;
            const Py_ssize_t j1 = position + 1 - base < count ? position + 1 - base : count;
            if (j0 >= j1) continue;
            /* the token's query heads' scores, sharing each key row */
            memset(scores, 0, (size_t)(group * bs) * sizeof(float));
            for (Py_ssize_t i = 0; i < dim; i++) {
                const float *row = keys + i * bs;
                for (Py_ssize_t g = 0; g < group; g++) {
                    const float qi = queries[(t * group + g) * dim + i];
                    float *head = scores + g * bs;
#pragma omp simd
                    for (Py_ssize_t j = j0; j < j1; j++) head[j] += qi * row[j];
                }
            }
            for (Py_ssize_t g = 0; g < group; g++) {
                const Py_ssize_t r = t * group + g;
                const float *head = scores + g * bs;
                float top = peak[r];
                for (Py_ssize_t j = j0; j < j1; j++) top = head[j] > top ? head[j] : top;
                float sum = total[r] * exp_nonpositive(peak[r] - top);
#pragma omp simd reduction(+ : sum)
                for (Py_ssize_t j = j0; j < j1; j++) sum += exp_nonpositive(head[j] - top);
                peak[r] = top;
                total[r] = sum;
            }
        }
    }
    for (Py_ssize_t t = 0; t < n; t++)
        for (Py_ssize_t g = 0; g < group; g++) {
            const Py_ssize_t r = t * group + g;
            const float lse = peak[r] + logf(total[r]);
            job->out[(item->token0 + t) * job->heads + h * group + g] =
                1.0f / (1.0f + expf(job->sinks[h * group + g] - lse));
        }
    (void)slot;
}

/* attention_sink_factors(q, key_cache, key_scales, sinks, out, query_starts, context_lens, block_tables,
 *                        tokens, heads, kv_heads, head_dim, block_size, table_width, scale, kv_type, window,
 *                        threads)
 * out [tokens, heads] float32: each query head's factor 1 / (1 + exp(sinks[h] - lse)) over the positions the
 * native attention (attention.c, same arguments) lets it see, the keys already cached. */
PyObject *native_attention_sink_factors(PyObject *self, PyObject *args)
{
    Py_buffer q, kc, ks, sinks, out, starts, lens, tables;
    Py_ssize_t tokens, heads, kv_heads, head_dim, block_size, width, window;
    double scale;
    int kv_type, threads;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*y*y*y*nnnnnndini", &q, &kc, &ks, &sinks, &out, &starts, &lens, &tables,
                          &tokens, &heads, &kv_heads, &head_dim, &block_size, &width, &scale, &kv_type, &window,
                          &threads))
        return NULL;
    PyObject *result = NULL;
    struct sink_item *items = NULL;
    const Py_ssize_t seqs = lens.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *query_starts = starts.buf, *context_lens = lens.buf, *block_tables = tables.buf;
    if (kv_type < 0 || kv_type >= KV_TYPES || kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0 ||
        block_size <= 0 || tokens < 0 || width < 0) {
        PyErr_SetString(PyExc_ValueError, "attention_sink_factors: bad shapes or KV-cache type");
        goto done;
    }
    const Py_ssize_t block_bytes = kv_heads * head_dim * block_size * KEY_BYTES[kv_type];
    const Py_ssize_t blocks = kc.len / block_bytes;
    if (q.len != tokens * heads * head_dim * (Py_ssize_t)sizeof(float) ||
        out.len != tokens * heads * (Py_ssize_t)sizeof(float) || sinks.len != heads * (Py_ssize_t)sizeof(float) ||
        kc.len % block_bytes != 0 ||
        ks.len != (kv_type == KV_I8 ? blocks * kv_heads * block_size * (Py_ssize_t)sizeof(float) : 0) ||
        starts.len != (seqs + 1) * (Py_ssize_t)sizeof(int64_t) ||
        tables.len != seqs * width * (Py_ssize_t)sizeof(int64_t) || query_starts[seqs] != tokens) {
        PyErr_SetString(PyExc_ValueError, "attention_sink_factors: buffer sizes do not match the given shapes");
        goto done;
    }
    Py_ssize_t count = 0;
    for (Py_ssize_t s = 0; s < seqs; s++) {
        const int64_t queries = query_starts[s + 1] - query_starts[s];
        const Py_ssize_t used = (context_lens[s] + block_size - 1) / block_size;
        int bad = queries < 0 || queries > context_lens[s] || query_starts[s] < 0 || used > width;
        for (Py_ssize_t b = 0; !bad && b < used; b++)
            bad = block_tables[s * width + b] < 0 || block_tables[s * width + b] >= blocks;
        if (bad) {
            PyErr_SetString(PyExc_ValueError,
                            "attention_sink_factors: query_starts/context_lens/block_tables disagree with each other "
                            "or the cache");
            goto done;
        }
        count += (queries + SINK_TILE - 1) / SINK_TILE * kv_heads;
    }
    items = PyMem_RawMalloc((size_t)(count > 0 ? count : 1) * sizeof(*items));
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t s = 0; s < seqs; s++)
        for (int64_t t0 = query_starts[s]; t0 < query_starts[s + 1]; t0 += SINK_TILE)
            for (Py_ssize_t h = 0; h < kv_heads; h++) {
                const Py_ssize_t left = query_starts[s + 1] - t0;
                items[n++] = (struct sink_item){s, h, t0, left < SINK_TILE ? left : SINK_TILE};
            }
    struct sink_job job = {
        .q = q.buf, .sinks = sinks.buf, .key_scales = ks.buf, .key_cache = kc.buf, .query_starts = query_starts,
        .context_lens = context_lens, .block_tables = block_tables, .out = out.buf, .heads = heads,
        .kv_heads = kv_heads, .head_dim = head_dim, .block_size = block_size, .width = width,
        .window = window > 0 ? window : 0, .scale = (float)scale, .kv_type = kv_type, .items = items,
    };
    Py_BEGIN_ALLOW_THREADS
    fd_parallel_for(count, threads, sink_task, &job);
    Py_END_ALLOW_THREADS
    result = job.out_of_memory ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    PyMem_RawFree(items);
    PyBuffer_Release(&q);
    PyBuffer_Release(&kc);
    PyBuffer_Release(&ks);
    PyBuffer_Release(&sinks);
    PyBuffer_Release(&out);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&tables);
    return result;
}
