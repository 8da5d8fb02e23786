/*
 * The attention and element-wise kernels, written once in plain C (GCC vector extensions and
 * `omp simd`) and compiled once per instruction set. row_kernels_avx2.c and row_kernels_avx512.c
 * set the target and define, before including this file:
 *   ROW_KERNELS   the name of the table of entry points to define
 *   LANES         floats per vector register (8 or 16): `vecf` is one register, never wider, since
 *                 GCC splits wider vector types into slow piecewise code
 *   ATTN_CHUNK    positions scored at once (their accumulators stay in registers)
 *   KERNEL_HEADS  query heads that share each key/value row load (<= HEADS_AT_ONCE)
 *   ENCODER_ROWS  query rows of one head that share each key/value row load in the encoder
 *                 attention (<= ENCODER_ROWS_AT_ONCE): no cache types to serve, so more registers
 *   LOAD_F16(p), LOAD_BF16(p), LOAD_I8(p)  LANES cached float16 / bfloat16 / int8 values widened
 *                 to float32 (the KV cache's element types, attention_kernels.h)
 * Not a header to include anywhere else.
 */
#include "native.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

typedef float vecf __attribute__((vector_size(LANES * 4), aligned(4))); /* any alignment */
#define MAX_VECTORS_PER_HEAD (128 / LANES) /* head_dim up to 128 on the vector path */
/* the most query rows the score and value loops take at once (their accumulator arrays' size) */
#define ROWS_AT_ONCE (ENCODER_ROWS > KERNEL_HEADS ? ENCODER_ROWS : KERNEL_HEADS)
_Static_assert(KERNEL_HEADS <= HEADS_AT_ONCE && ENCODER_ROWS <= ENCODER_ROWS_AT_ONCE, "scratch sized for fewer rows");

static inline float bf16_to_f32(uint16_t value)
{
    const uint32_t bits = (uint32_t)value << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
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

/* In place: the first `visible` scores of each of the rows become cap * tanh(score / cap), attention
 * logit soft-capping (Gemma 2). tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2|x|) <= 1, so
 * exp_f32 never overflows and the loop vectorises. */
static inline __attribute__((always_inline)) void softcap_rows(float *scores, int rows, Py_ssize_t stride,
                                                               Py_ssize_t visible, float cap)
{
    const float inverse = 1.0f / cap;
    for (int h = 0; h < rows; h++) {
        float *row = scores + h * stride;
#pragma omp simd
        for (Py_ssize_t j = 0; j < visible; j++) {
            const float x = row[j] * inverse, e = exp_f32(-2.0f * fabsf(x));
            row[j] = copysignf(cap * (1.0f - e) / (1.0f + e), x);
        }
    }
}

/* The attention kernels, once per KV-cache element type (attention_kernels.h): the loads that
 * widen a run of LANES cached values to a vector, and one value to a float. */
#define KV_NAME f32
#define KV_T float
#define KV_LOAD(p) (*(const vecf *)(p))
#define KV_ONE(p) (*(p))
#define KV_SCALED 0
#include "attention_kernels.h"

#define KV_NAME f16
#define KV_T uint16_t
#define KV_LOAD(p) LOAD_F16(p)
#define KV_ONE(p) _cvtsh_ss(*(p))
#define KV_SCALED 0
#include "attention_kernels.h"

#define KV_NAME bf16
#define KV_T uint16_t
#define KV_LOAD(p) LOAD_BF16(p)
#define KV_ONE(p) bf16_to_f32(*(p))
#define KV_SCALED 0
#include "attention_kernels.h"

#define KV_NAME i8
#define KV_T int8_t
#define KV_LOAD(p) LOAD_I8(p)
#define KV_ONE(p) ((float)*(p))
#define KV_SCALED 1
#include "attention_kernels.h"

/* ENCODER_ARGS (native.h): a vision encoder's attention, no cache, no mask. Up to ENCODER_ROWS query
 * rows of the head take the place of the paged kernels' query heads, so each key and value row
 * load serves them all; the segment is read as one block of `padded` positions. */
static inline __attribute__((always_inline)) void
encoder_attend(const float *q, float *out, Py_ssize_t tokens, Py_ssize_t row_stride, const float *keys_t,
               const float *values, Py_ssize_t padded, Py_ssize_t count, const Py_ssize_t head_dim, float scale,
               float *scratch)
{
    float *q_scaled = scratch, *rows_out = scratch + ENCODER_ROWS_AT_ONCE * head_dim;
    float *scores = rows_out + ENCODER_ROWS_AT_ONCE * head_dim;
    const int64_t table = 0; /* the segment is one "block" of `padded` positions */
    for (Py_ssize_t t0 = 0; t0 < tokens; t0 += ENCODER_ROWS) {
        const int n = tokens - t0 < ENCODER_ROWS ? (int)(tokens - t0) : ENCODER_ROWS;
        for (int r = 0; r < n; r++)
            for (Py_ssize_t d = 0; d < head_dim; d++) q_scaled[r * head_dim + d] = q[(t0 + r) * row_stride + d] * scale;
#define ENCODER_ROWS_CASE(rows)                                                                             \
    case rows:                                                                                               \
        score_block_f32(q_scaled, rows, keys_t, NULL, padded, count, head_dim, scores, padded);              \
        softmax_rows(scores, rows, padded, count);                                                           \
        weighted_values_f32(scores, rows, padded, count, values, NULL, &table, padded, 1, 0, head_dim, rows_out); \
        break;
        switch (n) {
            ENCODER_ROWS_CASE(1)
#if ENCODER_ROWS >= 2
            ENCODER_ROWS_CASE(2)
#endif
#if ENCODER_ROWS >= 3
            ENCODER_ROWS_CASE(3)
#endif
#if ENCODER_ROWS >= 4
            ENCODER_ROWS_CASE(4)
#endif
#if ENCODER_ROWS >= 5
            ENCODER_ROWS_CASE(5)
#endif
#if ENCODER_ROWS >= 6
            ENCODER_ROWS_CASE(6)
#endif
        }
#undef ENCODER_ROWS_CASE
        for (int r = 0; r < n; r++)
            memcpy(out + (t0 + r) * row_stride, rows_out + r * head_dim, (size_t)head_dim * sizeof(float));
    }
}

#define ENCODER_PASS(dim) encoder_attend(q, out, tokens, row_stride, keys_t, values, padded, count, dim, scale, scratch)
static void encoder_attend_d64(ENCODER_ARGS) { (void)head_dim; ENCODER_PASS(64); }
static void encoder_attend_any(ENCODER_ARGS) { ENCODER_PASS(head_dim); }

/* The row a norm reads: x, or x + residual written to `sum_out` when a residual is given. */
static inline __attribute__((always_inline)) const float *with_residual(const float *x, const float *residual,
                                                                         float *sum_out, Py_ssize_t cols)
{
    if (residual == NULL) return x;
#pragma omp simd
    for (Py_ssize_t i = 0; i < cols; i++) sum_out[i] = x[i] + residual[i];
    return sum_out;
}

/* RMSNorm of one row of (x + residual); the sum goes to `sum_out` when a residual is given. */
static void rms_norm_row(const float *x, const float *residual, const float *weight, float *out,
                                float *sum_out, Py_ssize_t cols, float eps)
{
    const float *src = with_residual(x, residual, sum_out, cols);
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (Py_ssize_t i = 0; i < cols; i++) squares += src[i] * src[i];
    const float scale = 1.0f / sqrtf(squares / (float)cols + eps);
#pragma omp simd
    for (Py_ssize_t i = 0; i < cols; i++) out[i] = src[i] * scale * weight[i];
}

/* LayerNorm of one row of (x + residual): the mean, then the variance of the centred row (two
 * passes, as the numpy path), times weight plus bias (NULL: none). */
static void layer_norm_row(const float *x, const float *residual, const float *weight, const float *bias,
                           float *out, float *sum_out, Py_ssize_t cols, float eps)
{
    const float *src = with_residual(x, residual, sum_out, cols);
    float total = 0.0f, squares = 0.0f;
#pragma omp simd reduction(+ : total)
    for (Py_ssize_t i = 0; i < cols; i++) total += src[i];
    const float mean = total / (float)cols;
#pragma omp simd reduction(+ : squares)
    for (Py_ssize_t i = 0; i < cols; i++) squares += (src[i] - mean) * (src[i] - mean);
    const float scale = 1.0f / sqrtf(squares / (float)cols + eps);
    if (bias == NULL) {
#pragma omp simd
        for (Py_ssize_t i = 0; i < cols; i++) out[i] = (src[i] - mean) * scale * weight[i];
        return;
    }
#pragma omp simd
    for (Py_ssize_t i = 0; i < cols; i++) out[i] = (src[i] - mean) * scale * weight[i] + bias[i];
}

/* x * sigmoid(1.702 x) (CLIP's quick GELU) of one row. */
static void quick_gelu_row(const float *x, float *out, Py_ssize_t cols)
{
#pragma omp simd
    for (Py_ssize_t i = 0; i < cols; i++) out[i] = x[i] / (1.0f + exp_f32(-1.702f * x[i]));
}

/* Exact GELU x * Phi(x) of one row, erf by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7,
 * as the numpy path; float32 arithmetic adds ~1e-7). */
static void gelu_erf_row(const float *x, float *out, Py_ssize_t cols)
{
#pragma omp simd
    for (Py_ssize_t i = 0; i < cols; i++) {
        const float h = x[i], z = (h < 0.0f ? -h : h) * 0.70710678f;
        const float t = 1.0f / (1.0f + 0.3275911f * z);
        const float poly =
            t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
        const float erf_abs = 1.0f - poly * exp_f32(-z * z);
        out[i] = 0.5f * h * (1.0f + (h < 0.0f ? -erf_abs : erf_abs));
    }
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
    {
        {attend_item_d64_f32, attend_item_d128_f32, attend_item_any_f32},
        {attend_item_d64_f16, attend_item_d128_f16, attend_item_any_f16},
        {attend_item_d64_bf16, attend_item_d128_bf16, attend_item_any_bf16},
        {attend_item_d64_i8, attend_item_d128_i8, attend_item_any_i8},
    },
    rms_norm_row, silu_mul_row, rotary_row,
    encoder_attend_d64, encoder_attend_any,
    layer_norm_row, {quick_gelu_row, gelu_erf_row},
};
