/*
 * The attention and element-wise kernels, written once in plain C (GCC vector extensions and
 * `omp simd`) and compiled once per instruction set. row_kernels_avx2.c and row_kernels_avx512.c
 * set the target and define, before including this file:
 *   ROW_KERNELS   the name of the table of entry points to define
 *   LANES         floats per vector register (8 or 16): `vecf` is one register, never wider, since
 *                 GCC splits wider vector types into slow piecewise code
 *   ATTN_CHUNK    positions scored at once (their accumulators stay in registers)
 *   KERNEL_HEADS  query heads that share each key/value row load (<= HEADS_AT_ONCE)
 * Not a header to include anywhere else.
 */
#include "native.h"

#include <math.h>
#include <string.h>

/* Attention work comes in items (struct attn_item): one kv head of one sequence for some of its
 * query tokens. Keys are cached transposed per block ([blocks, kv_heads, head_dim, block_size]),
 * so scores for a run of positions come from broadcasting one query element at a time (vectorised
 * over positions, no horizontal sums). Values are cached [blocks, kv_heads, block_size, head_dim]. Each
 * query head takes a softmax (normalised like numpy's) and its probability-weighted values. */
typedef float vecf __attribute__((vector_size(LANES * 4), aligned(4))); /* any alignment */
#define MAX_VECTORS_PER_HEAD (128 / LANES) /* head_dim up to 128 on the vector path */

/* scores[h][j] = q_h . key_j for the `count` positions of one cached key block ([head_dim][block_size]);
 * q_scaled [heads_now][head_dim], scores rows `stride` apart. */
static inline __attribute__((always_inline)) void
score_block(const float *q_scaled, int heads_now, const float *keys_t, Py_ssize_t block_size, Py_ssize_t count,
            const Py_ssize_t head_dim, float *scores, Py_ssize_t stride)
{
    if (block_size % ATTN_CHUNK == 0) {
        for (Py_ssize_t c = 0; c < count; c += ATTN_CHUNK) {
            vecf acc[KERNEL_HEADS][ATTN_CHUNK / LANES] = {{{0}}};
            for (Py_ssize_t d = 0; d < head_dim; d++) {
                const vecf *row = (const vecf *)(keys_t + d * block_size + c);
#pragma GCC unroll 4
                for (int i = 0; i < ATTN_CHUNK / LANES; i++) {
                    const vecf keys = row[i];
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
    if (head_dim % LANES == 0 && head_dim / LANES <= MAX_VECTORS_PER_HEAD) {
        vecf acc[KERNEL_HEADS][MAX_VECTORS_PER_HEAD] = {{{0}}};
        for (Py_ssize_t first = 0; first < visible; first += block_size) {
            const float *values = value_cache + (table[first / block_size] * num_kv_heads + kv_head) * block_floats;
            const Py_ssize_t count = visible - first < block_size ? visible - first : block_size;
            for (Py_ssize_t j = 0; j < count; j++) {
                const vecf *value = (const vecf *)(values + j * head_dim);
#pragma GCC unroll 8
                for (int i = 0; i < head_dim / LANES; i++) {
                    const vecf v = value[i];
                    for (int h = 0; h < heads_now; h++) acc[h][i] += probs[h * stride + first + j] * v;
                }
            }
        }
        for (int h = 0; h < heads_now; h++)
            for (int i = 0; i < head_dim / LANES; i++) memcpy(out + h * head_dim + LANES * i, &acc[h][i], sizeof(vecf));
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
        for (Py_ssize_t g = 0; g < group; g += KERNEL_HEADS) {
            const Py_ssize_t offset = (item->token0 + t) * heads * head_dim + (item->kv_head * group + g) * head_dim;
#define ATTEND_HEADS(n)                                                                                      \
    attend_heads(q, out, offset, n, first_visible + t, key_cache, value_cache, table, block_size, num_kv_heads, \
                 item->kv_head, head_dim, scale, q_scaled, scores, stride)
            switch (group - g < KERNEL_HEADS ? (int)(group - g) : KERNEL_HEADS) {
            case 1: ATTEND_HEADS(1); break;
#if KERNEL_HEADS >= 2
            case 2: ATTEND_HEADS(2); break;
#endif
#if KERNEL_HEADS >= 3
            case 3: ATTEND_HEADS(3); break;
#endif
#if KERNEL_HEADS >= 4
            case 4: ATTEND_HEADS(4); break;
#endif
            }
#undef ATTEND_HEADS
        }
    }
}

#define ATTEND_PASS(dim)                                                                                         \
    attend_item(item, q, out, key_cache, value_cache, query_starts, context_lens, block_tables, width, block_size, \
                heads, num_kv_heads, dim, scale, q_scaled, scores, stride)

/* one copy per common head size, so the compiler unrolls the head_dim loops */
static void attend_item_d64(ATTEND_ARGS) { (void)head_dim; ATTEND_PASS(64); }
static void attend_item_d128(ATTEND_ARGS) { (void)head_dim; ATTEND_PASS(128); }
static void attend_item_any(ATTEND_ARGS) { ATTEND_PASS(head_dim); }

/* ENCODER_ARGS (native.h): a vision encoder's attention, no cache, no mask. Up to KERNEL_HEADS query
 * rows of the head take the place of the paged kernels' query heads, so each key and value row
 * load serves them all; the segment is read as one block of `padded` positions. */
static inline __attribute__((always_inline)) void
encoder_attend(const float *q, float *out, Py_ssize_t tokens, Py_ssize_t row_stride, const float *keys_t,
               const float *values, Py_ssize_t padded, Py_ssize_t count, const Py_ssize_t head_dim, float scale,
               float *scratch)
{
    float *q_scaled = scratch, *rows_out = scratch + HEADS_AT_ONCE * head_dim;
    float *scores = rows_out + HEADS_AT_ONCE * head_dim;
    const int64_t table = 0; /* the segment is one "block" of `padded` positions */
    for (Py_ssize_t t0 = 0; t0 < tokens; t0 += KERNEL_HEADS) {
        const int n = tokens - t0 < KERNEL_HEADS ? (int)(tokens - t0) : KERNEL_HEADS;
        for (int r = 0; r < n; r++)
            for (Py_ssize_t d = 0; d < head_dim; d++) q_scaled[r * head_dim + d] = q[(t0 + r) * row_stride + d] * scale;
#define ENCODER_ROWS(rows)                                                                                   \
    score_block(q_scaled, rows, keys_t, padded, count, head_dim, scores, padded);                            \
    softmax_rows(scores, rows, padded, count);                                                               \
    weighted_values(scores, rows, padded, count, values, &table, padded, 1, 0, head_dim, rows_out)
        switch (n) {
        case 1: ENCODER_ROWS(1); break;
#if KERNEL_HEADS >= 2
        case 2: ENCODER_ROWS(2); break;
#endif
#if KERNEL_HEADS >= 3
        case 3: ENCODER_ROWS(3); break;
#endif
#if KERNEL_HEADS >= 4
        case 4: ENCODER_ROWS(4); break;
#endif
        }
#undef ENCODER_ROWS
        for (int r = 0; r < n; r++)
            memcpy(out + (t0 + r) * row_stride, rows_out + r * head_dim, (size_t)head_dim * sizeof(float));
    }
}

#define ENCODER_PASS(dim) encoder_attend(q, out, tokens, row_stride, keys_t, values, padded, count, dim, scale, scratch)
static void encoder_attend_d64(ENCODER_ARGS) { (void)head_dim; ENCODER_PASS(64); }
static void encoder_attend_any(ENCODER_ARGS) { ENCODER_PASS(head_dim); }

/* RMSNorm of one row of (x + residual); the sum goes to `sum_out` when a residual is given. */
static void rms_norm_row(const float *x, const float *residual, const float *weight, float *out,
                                float *sum_out, Py_ssize_t cols, float eps)
{
    const float *src = x;
    if (residual != NULL) {
#pragma omp simd
        for (Py_ssize_t i = 0; i < cols; i++) sum_out[i] = x[i] + residual[i];
        src = sum_out;
    }
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (Py_ssize_t i = 0; i < cols; i++) squares += src[i] * src[i];
    const float scale = 1.0f / sqrtf(squares / (float)cols + eps);
#pragma omp simd
    for (Py_ssize_t i = 0; i < cols; i++) out[i] = src[i] * scale * weight[i];
}

/* silu(gate) * up for one row of [gate | up]. */
static void silu_mul_row(const float *x, float *out, Py_ssize_t half)
{
#pragma omp simd
    for (Py_ssize_t i = 0; i < half; i++) {
        const float gate = x[i];
        out[i] = gate / (1.0f + exp_f32(-gate)) * x[half + i];
    }
}

/* Rotate-half rotary embedding of one token's heads at `position` (cos/sin rows of `half` values);
 * columns past 2*half are copied unrotated. */
static void rotary_row(const float *x, float *out, const float *cos_row, const float *sin_row,
                              Py_ssize_t heads, Py_ssize_t head_dim, Py_ssize_t half)
{
    for (Py_ssize_t h = 0; h < heads; h++) {
        const float *xh = x + h * head_dim;
        float *oh = out + h * head_dim;
#pragma omp simd
        for (Py_ssize_t i = 0; i < half; i++) {
            oh[i] = xh[i] * cos_row[i] - xh[half + i] * sin_row[i];
            oh[half + i] = xh[half + i] * cos_row[i] + xh[i] * sin_row[i];
        }
        for (Py_ssize_t i = 2 * half; i < head_dim; i++) oh[i] = xh[i];
    }
}

const struct row_kernels ROW_KERNELS = {
    attend_item_d64, attend_item_d128, attend_item_any, rms_norm_row, silu_mul_row, rotary_row,
    encoder_attend_d64, encoder_attend_any,
};
