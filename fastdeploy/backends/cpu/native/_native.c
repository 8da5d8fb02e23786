/*
 * Native kernels of the cpu backend: matrix products on GGUF-quantised weights without
 * dequantising them to memory first.
 *
 * Why: a decode step of a small model reads every weight once. Read as float32 that is four
 * bytes a weight; read in the GGUF's own Q4_1/Q8_0 blocks it is 0.625/1.06 bytes. The blocks are
 * dequantised in registers to exactly the float32 values `gguf.quants.dequantize` produces
 * (d*q+m and d*q are exact products rounded once), then multiplied in float32 with float32
 * activations, so results equal a float32 matmul on the dequantised weights up to summation order.
 *
 * Weights are repacked at load time (see packing.py) into panels of 16 output columns:
 *   Q4_1 panel block (320 bytes, 32 k x 16 columns):
 *     d[16] fp16, m[16] fp16, then 16 rows j of 16 bytes: byte n = q[2j][n] | q[2j+1][n] << 4
 *   Q8_0 panel block (544 bytes): d[16] fp16, then 32 rows k of 16 int8 q[k][n]
 * A panel's blocks follow each other along k, panels along n.
 *   float32 weights (KIND_F32, any depth) are stored as pairs of panels, [pairs][k][32 columns],
 *   with the columns padded to a multiple of 32: already the kernels' float buffer layout.
 *
 * Two instruction sets are compiled with target attributes and chosen at run time: AVX-512
 * (16 columns in one register, 16 activation rows per tile) and AVX2+FMA+F16C (two registers,
 * 4 rows per tile). Work is split over panels with OpenMP; the GIL is released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <immintrin.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#define PANEL 16
#define QBLOCK 32
#define Q4_1_PANEL_BLOCK_BYTES (PANEL * 2 * 2 + PANEL * QBLOCK / 2)
#define Q8_0_PANEL_BLOCK_BYTES (PANEL * 2 + PANEL * QBLOCK)

enum weight_kind { KIND_Q4_1 = 0, KIND_Q8_0 = 1, KIND_F32 = 2 };
enum isa { ISA_NONE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

/* Arguments of one product out[m, n] = sum_k x[m, k] * w[n, k]. */
struct gemm_args {
    const float *x;
    const uint8_t *packed;
    float *out;
    Py_ssize_t rows, cols, depth;
    int kind;
};

/* Each instruction set has: dequantisation of one k row of a panel block (16 columns), a tile
 * kernel multiplying up to ROWS activation rows by one panel straight from its blocks (few rows:
 * every weight is used by few rows, so it is dequantised where it is used), and a tile kernel over
 * a panel dequantised once into a float buffer (many rows: the buffer is reused by every row
 * tile). Both produce the same float32 weights and sum over k in the same order. */
#define BLOCK_BYTES(kind) ((kind) == KIND_Q4_1 ? Q4_1_PANEL_BLOCK_BYTES : Q8_0_PANEL_BLOCK_BYTES)

/* ---------------------------------------------------------------- AVX-512 */
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define AVX512_ROWS 16

/* The weights of a panel block's k rows 2j and 2j+1 (Q4_1, both from one 16-byte load) or of
 * row k (Q8_0); `d` and `m` are the block's scales and minimums as floats. */
static inline __attribute__((always_inline)) AVX512_TARGET void
avx512_q4_1_pair(const uint8_t *blk, int j, __m512 d, __m512 m, __m512 *even, __m512 *odd)
{
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i v = _mm_loadu_si128((const __m128i *)(blk + 64 + 16 * j));
    *even = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, low))), d, m);
    *odd = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), low))), d, m);
}

static inline __attribute__((always_inline)) AVX512_TARGET __m512 avx512_q8_0_row(const uint8_t *blk, int k, __m512 d)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 32 + 16 * k));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
}

static inline __attribute__((always_inline)) AVX512_TARGET __m512 avx512_scales(const uint8_t *blk, int offset)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + offset)));
}

/* Calls STEP(k, w) for the 32 k rows of a panel block, in order, with their weights w. */
#define AVX512_FOR_BLOCK_ROWS(kind, blk, STEP)                                         \
    do {                                                                               \
        const __m512 d_ = avx512_scales(blk, 0);                                       \
        if ((kind) == KIND_Q4_1) {                                                     \
            const __m512 m_ = avx512_scales(blk, 32);                                  \
            for (int j_ = 0; j_ < QBLOCK / 2; j_++) {                                  \
                __m512 even_, odd_;                                                    \
                avx512_q4_1_pair(blk, j_, d_, m_, &even_, &odd_);                      \
                STEP(2 * j_, even_);                                                   \
                STEP(2 * j_ + 1, odd_);                                                \
            }                                                                          \
        } else {                                                                       \
            for (int k_ = 0; k_ < QBLOCK; k_++) STEP(k_, avx512_q8_0_row(blk, k_, d_)); \
        }                                                                              \
    } while (0)

/* Stores acc[r * width + i], the rows' sums for panel i of the tile starting at column col0. */
static inline __attribute__((always_inline)) AVX512_TARGET void
avx512_store(const struct gemm_args *a, const __m512 *acc, Py_ssize_t row0, int rows, Py_ssize_t col0, int width)
{
    for (int i = 0; i < width; i++) {
        const Py_ssize_t start = col0 + i * PANEL;
        const Py_ssize_t valid = a->cols - start < PANEL ? a->cols - start : PANEL;
        const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
        for (int r = 0; r < rows; r++)
            _mm512_mask_storeu_ps(a->out + (row0 + r) * a->cols + start, mask, acc[r * width + i]);
    }
}

static inline __attribute__((always_inline)) AVX512_TARGET void
avx512_tile_blocks(const struct gemm_args *a, const uint8_t *panel, Py_ssize_t row0, int rows, Py_ssize_t col0)
{
    __m512 acc[AVX512_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    const float *x = a->x + row0 * a->depth;
    for (Py_ssize_t b = 0; b < a->depth / QBLOCK; b++) {
        const float *xb = x + b * QBLOCK;
#define ACCUMULATE(k, w) \
    for (int r = 0; r < rows; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(xb[r * a->depth + (k)]), (w), acc[r])
        AVX512_FOR_BLOCK_ROWS(a->kind, panel + b * BLOCK_BYTES(a->kind), ACCUMULATE);
#undef ACCUMULATE
    }
    avx512_store(a, acc, row0, rows, col0, 1);
}

/* `width` panels (16 columns each) from float weights whose row k starts at weights + k * ld. */
static inline __attribute__((always_inline)) AVX512_TARGET void
avx512_tile_floats(const struct gemm_args *a, const float *weights, Py_ssize_t ld, int width, Py_ssize_t row0,
                   int rows, Py_ssize_t col0)
{
    __m512 acc[AVX512_ROWS * 2];
    for (int i = 0; i < rows * width; i++) acc[i] = _mm512_setzero_ps();
    const float *x = a->x + row0 * a->depth;
    for (Py_ssize_t k = 0; k < a->depth; k++) {
        __m512 w[2];
        for (int i = 0; i < width; i++) w[i] = _mm512_loadu_ps(weights + k * ld + i * PANEL);
        for (int r = 0; r < rows; r++) {
            const __m512 xv = _mm512_set1_ps(x[r * a->depth + k]);
            for (int i = 0; i < width; i++) acc[r * width + i] = _mm512_fmadd_ps(xv, w[i], acc[r * width + i]);
        }
    }
    avx512_store(a, acc, row0, rows, col0, width);
}

#define AVX512_BLOCKS_CASE(n) case n: avx512_tile_blocks(a, panel, row0, n, col0); break;
#define AVX512_FLOATS_CASE(n, width) case n: avx512_tile_floats(a, weights, ld, width, row0, n, col0); break;
/* rows per tile: 16 accumulators for one panel, 24 for two (12 rows) */
#define AVX512_PAIR_ROWS 12

/* Panels p .. p+count-1 (count 1 or 2, p even) for all rows; `weights` is a depth x 32 float scratch
 * buffer for dequantised blocks. */
static AVX512_TARGET void avx512_panels(const struct gemm_args *a, Py_ssize_t p, int count, float *weights)
{
    const Py_ssize_t blocks = a->depth / QBLOCK;
    Py_ssize_t ld = count * PANEL;
    if (a->kind == KIND_F32) {
        weights = (float *)a->packed + p / 2 * a->depth * 2 * PANEL;
        ld = 2 * PANEL;
    } else if (a->rows <= AVX512_ROWS || weights == NULL) { /* few rows (or no scratch): straight from the blocks */
        for (int i = 0; i < count; i++) {
            const uint8_t *panel = a->packed + (p + i) * blocks * BLOCK_BYTES(a->kind);
            const Py_ssize_t col0 = (p + i) * PANEL;
            for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX512_ROWS) {
                const Py_ssize_t left = a->rows - row0;
                /* constant row counts let the compiler keep every accumulator in a register */
                switch (left < AVX512_ROWS ? (int)left : AVX512_ROWS) {
                    AVX512_BLOCKS_CASE(1) AVX512_BLOCKS_CASE(2) AVX512_BLOCKS_CASE(3) AVX512_BLOCKS_CASE(4)
                    AVX512_BLOCKS_CASE(5) AVX512_BLOCKS_CASE(6) AVX512_BLOCKS_CASE(7) AVX512_BLOCKS_CASE(8)
                    AVX512_BLOCKS_CASE(9) AVX512_BLOCKS_CASE(10) AVX512_BLOCKS_CASE(11) AVX512_BLOCKS_CASE(12)
                    AVX512_BLOCKS_CASE(13) AVX512_BLOCKS_CASE(14) AVX512_BLOCKS_CASE(15) AVX512_BLOCKS_CASE(16)
                }
            }
        }
        return;
    }
    for (int i = 0; i < count && a->kind != KIND_F32; i++) {
        const uint8_t *panel = a->packed + (p + i) * blocks * BLOCK_BYTES(a->kind);
        for (Py_ssize_t b = 0; b < blocks; b++) {
            float *wb = weights + (b * QBLOCK * count + i) * PANEL;
#define STORE(k, w) _mm512_storeu_ps(wb + (k) * count * PANEL, (w))
            AVX512_FOR_BLOCK_ROWS(a->kind, panel + b * BLOCK_BYTES(a->kind), STORE);
#undef STORE
        }
    }
    const Py_ssize_t col0 = p * PANEL;
    const int tile = count == 2 ? AVX512_PAIR_ROWS : AVX512_ROWS;
    for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += tile) {
        const int rows = a->rows - row0 < tile ? (int)(a->rows - row0) : tile;
        if (count == 2) {
            switch (rows) {
                AVX512_FLOATS_CASE(1, 2) AVX512_FLOATS_CASE(2, 2) AVX512_FLOATS_CASE(3, 2)
                AVX512_FLOATS_CASE(4, 2) AVX512_FLOATS_CASE(5, 2) AVX512_FLOATS_CASE(6, 2)
                AVX512_FLOATS_CASE(7, 2) AVX512_FLOATS_CASE(8, 2) AVX512_FLOATS_CASE(9, 2)
                AVX512_FLOATS_CASE(10, 2) AVX512_FLOATS_CASE(11, 2) AVX512_FLOATS_CASE(12, 2)
            }
        } else {
            switch (rows) {
                AVX512_FLOATS_CASE(1, 1) AVX512_FLOATS_CASE(2, 1) AVX512_FLOATS_CASE(3, 1)
                AVX512_FLOATS_CASE(4, 1) AVX512_FLOATS_CASE(5, 1) AVX512_FLOATS_CASE(6, 1)
                AVX512_FLOATS_CASE(7, 1) AVX512_FLOATS_CASE(8, 1) AVX512_FLOATS_CASE(9, 1)
                AVX512_FLOATS_CASE(10, 1) AVX512_FLOATS_CASE(11, 1) AVX512_FLOATS_CASE(12, 1)
                AVX512_FLOATS_CASE(13, 1) AVX512_FLOATS_CASE(14, 1) AVX512_FLOATS_CASE(15, 1)
                AVX512_FLOATS_CASE(16, 1)
            }
        }
    }
}

/* ------------------------------------------------------------------- AVX2 */
#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX2_ROWS 4

/* the 16 weights of row k of a panel block, as columns 0-7 and 8-15 */
static inline __attribute__((always_inline)) AVX2_TARGET void
avx2_weights(int kind, const uint8_t *blk, int k, __m256 *lo, __m256 *hi)
{
    const __m256 d_lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
    const __m256 d_hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
    if (kind == KIND_Q4_1) {
        const __m256 m_lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32)));
        const __m256 m_hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 48)));
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + 64 + 16 * (k / 2)));
        if (k % 2) q = _mm_srli_epi16(q, 4);
        q = _mm_and_si128(q, _mm_set1_epi8(0x0F));
        *lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), d_lo, m_lo);
        *hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))), d_hi, m_hi);
        return;
    }
    const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 32 + 16 * k));
    *lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d_lo);
    *hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), d_hi);
}

static inline __attribute__((always_inline)) AVX2_TARGET void
avx2_store(const struct gemm_args *a, const __m256 *lo, const __m256 *hi, Py_ssize_t row0, int rows, Py_ssize_t col0)
{
    const Py_ssize_t valid = a->cols - col0 < PANEL ? a->cols - col0 : PANEL;
    for (int r = 0; r < rows; r++) {
        float *dst = a->out + (row0 + r) * a->cols + col0;
        float tmp[PANEL];
        _mm256_storeu_ps(tmp, lo[r]);
        _mm256_storeu_ps(tmp + 8, hi[r]);
        memcpy(dst, tmp, (size_t)valid * sizeof(float));
    }
}

static inline __attribute__((always_inline)) AVX2_TARGET void
avx2_tile(const struct gemm_args *a, const uint8_t *panel, const float *weights, Py_ssize_t ld, Py_ssize_t row0,
          int rows, Py_ssize_t col0)
{
    __m256 lo[AVX2_ROWS], hi[AVX2_ROWS];
    for (int r = 0; r < rows; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    const float *x = a->x + row0 * a->depth;
    for (Py_ssize_t k = 0; k < a->depth; k++) {
        __m256 w_lo, w_hi;
        if (weights) {
            w_lo = _mm256_loadu_ps(weights + k * ld);
            w_hi = _mm256_loadu_ps(weights + k * ld + 8);
        } else {
            avx2_weights(a->kind, panel + k / QBLOCK * BLOCK_BYTES(a->kind), (int)(k % QBLOCK), &w_lo, &w_hi);
        }
        for (int r = 0; r < rows; r++) {
            const __m256 xv = _mm256_broadcast_ss(x + r * a->depth + k);
            lo[r] = _mm256_fmadd_ps(xv, w_lo, lo[r]);
            hi[r] = _mm256_fmadd_ps(xv, w_hi, hi[r]);
        }
    }
    avx2_store(a, lo, hi, row0, rows, col0);
}

#define AVX2_CASE(n) case n: avx2_tile(a, panel, weights, ld, row0, n, col0); break;

static AVX2_TARGET void avx2_panel(const struct gemm_args *a, Py_ssize_t p, float *weights)
{
    const uint8_t *panel = a->packed + p * (a->depth / QBLOCK) * BLOCK_BYTES(a->kind);
    const Py_ssize_t col0 = p * PANEL;
    Py_ssize_t ld = PANEL;
    if (a->kind == KIND_F32) {
        weights = (float *)a->packed + (p / 2 * a->depth * 2 + p % 2) * PANEL;
        ld = 2 * PANEL;
    } else if (a->rows <= AVX2_ROWS || weights == NULL) {
        weights = NULL;
    } else {
        for (Py_ssize_t k = 0; k < a->depth; k++) {
            __m256 w_lo, w_hi;
            avx2_weights(a->kind, panel + k / QBLOCK * BLOCK_BYTES(a->kind), (int)(k % QBLOCK), &w_lo, &w_hi);
            _mm256_storeu_ps(weights + k * PANEL, w_lo);
            _mm256_storeu_ps(weights + k * PANEL + 8, w_hi);
        }
    }
    for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX2_ROWS) {
        const Py_ssize_t left = a->rows - row0;
        switch (left < AVX2_ROWS ? (int)left : AVX2_ROWS) {
            AVX2_CASE(1) AVX2_CASE(2) AVX2_CASE(3) AVX2_CASE(4)
        }
    }
}

/* ------------------------------------------- attention and element-wise ops
 * Plain C loops over rows, vectorised by the compiler (`omp simd`) in one clone per instruction
 * set; the loader picks the clone for this CPU. Rows are independent, so OpenMP splits them.
 */
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

/* e^x for float32, vectorisable (the libm call is not): x = n ln2 + r, |r| <= ln2/2, and
 * e^r by its degree-7 Taylor polynomial (relative error below 2e-8 on that interval). */
static inline __attribute__((always_inline)) float exp_f32(float x)
{
    x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
    /* round to nearest by adding and removing 1.5 * 2^23 (vectorises, unlike rintf) */
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f; /* ln2 split in two for accuracy */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { float f; int32_t i; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* Attention work is split into items: one kv head of one sequence for up to ATTN_TILE of its
 * query tokens. Keys are cached transposed per block ([blocks, kv_heads, head_dim, block_size]),
 * so scores for a run of positions come from broadcasting one query element at a time (vectorised
 * over positions, no horizontal sums). Values are cached [slots, kv_heads, head_dim]. Each query
 * head takes a softmax (normalised like numpy's) and its probability-weighted values. */
#define ATTN_TILE 32
#define ATTN_CHUNK 64 /* positions scored at once when the block size allows; kept in registers */

struct attn_item {
    Py_ssize_t seq, kv_head, token0, tokens;
};

/* 16 floats, any alignment; GCC lowers arithmetic on it to whatever vectors the clone targets,
 * and keeps small constant-size arrays of it in registers. */
typedef float v16f __attribute__((vector_size(64), aligned(4)));
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
static PyObject *py_attention(PyObject *self, PyObject *args)
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

/* RMSNorm of one row of (x + residual); the sum goes to `sum_out` when a residual is given. */
static CLONES void rms_norm_row(const float *x, const float *residual, const float *weight, float *out,
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

/* rms_norm(x, residual or None, weight, eps, out, sum_out or None, rows, cols, threads) */
static PyObject *py_rms_norm(PyObject *self, PyObject *args)
{
    Py_buffer x, weight, out, residual = {0}, sum_out = {0};
    PyObject *residual_obj, *sum_obj;
    Py_ssize_t rows, cols;
    double eps;
    int threads;
    if (!PyArg_ParseTuple(args, "y*Oy*dw*Onni", &x, &residual_obj, &weight, &eps, &out, &sum_obj, &rows, &cols,
                          &threads))
        return NULL;
    PyObject *result = NULL;
    const int with_residual = residual_obj != Py_None;
    if (with_residual && (PyObject_GetBuffer(residual_obj, &residual, PyBUF_SIMPLE) < 0 ||
                          PyObject_GetBuffer(sum_obj, &sum_out, PyBUF_WRITABLE) < 0))
        goto done;
    const Py_ssize_t bytes = rows * cols * (Py_ssize_t)sizeof(float);
    if (x.len != bytes || out.len != bytes || weight.len != cols * (Py_ssize_t)sizeof(float) ||
        (with_residual && (residual.len != bytes || sum_out.len != bytes))) {
        PyErr_SetString(PyExc_ValueError, "rms_norm: buffer sizes do not match rows x cols");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (rows >= 64)
    for (Py_ssize_t r = 0; r < rows; r++)
        rms_norm_row((const float *)x.buf + r * cols, with_residual ? (const float *)residual.buf + r * cols : NULL,
                     weight.buf, (float *)out.buf + r * cols,
                     with_residual ? (float *)sum_out.buf + r * cols : NULL, cols, (float)eps);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&x);
    PyBuffer_Release(&weight);
    PyBuffer_Release(&out);
    if (residual.obj) PyBuffer_Release(&residual);
    if (sum_out.obj) PyBuffer_Release(&sum_out);
    return result;
}

/* silu(gate) * up for one row of [gate | up]. */
static CLONES void silu_mul_row(const float *x, float *out, Py_ssize_t half)
{
#pragma omp simd
    for (Py_ssize_t i = 0; i < half; i++) {
        const float gate = x[i];
        out[i] = gate / (1.0f + exp_f32(-gate)) * x[half + i];
    }
}

/* silu_and_mul(x, out, rows, half, threads): x [rows, 2*half] -> out [rows, half] */
static PyObject *py_silu_and_mul(PyObject *self, PyObject *args)
{
    Py_buffer x, out;
    Py_ssize_t rows, half;
    int threads;
    if (!PyArg_ParseTuple(args, "y*w*nni", &x, &out, &rows, &half, &threads)) return NULL;
    PyObject *result = NULL;
    if (x.len != 2 * rows * half * (Py_ssize_t)sizeof(float) || out.len != rows * half * (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "silu_and_mul: buffer sizes do not match rows x half");
    } else {
        Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (rows >= 16)
        for (Py_ssize_t r = 0; r < rows; r++)
            silu_mul_row((const float *)x.buf + 2 * r * half, (float *)out.buf + r * half, half);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    return result;
}

/* Rotate-half rotary embedding of one token's heads at `position` (cos/sin rows of `half` values);
 * columns past 2*half are copied unrotated. */
static CLONES void rotary_row(const float *x, float *out, const float *cos_row, const float *sin_row,
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

/* rotary(x, positions, cos, sin, out, tokens, heads, head_dim, half, threads) */
static PyObject *py_rotary(PyObject *self, PyObject *args)
{
    Py_buffer x, positions, cos, sin, out;
    Py_ssize_t tokens, heads, head_dim, half;
    int threads;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*nnnni", &x, &positions, &cos, &sin, &out, &tokens, &heads, &head_dim,
                          &half, &threads))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t bytes = tokens * heads * head_dim * (Py_ssize_t)sizeof(float);
    const Py_ssize_t table_rows = cos.len / (half > 0 ? half * (Py_ssize_t)sizeof(float) : 1);
    const int64_t *pos = positions.buf;
    int bad = x.len != bytes || out.len != bytes || positions.len != tokens * (Py_ssize_t)sizeof(int64_t) ||
              cos.len != sin.len || half <= 0 || 2 * half > head_dim;
    for (Py_ssize_t t = 0; !bad && t < tokens; t++) bad = pos[t] < 0 || pos[t] >= table_rows;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "rotary: buffer sizes or positions do not match the tables");
    } else {
        Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (tokens >= 64)
        for (Py_ssize_t t = 0; t < tokens; t++)
            rotary_row((const float *)x.buf + t * heads * head_dim, (float *)out.buf + t * heads * head_dim,
                       (const float *)cos.buf + pos[t] * half, (const float *)sin.buf + pos[t] * half, heads, head_dim,
                       half);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&cos);
    PyBuffer_Release(&sin);
    PyBuffer_Release(&out);
    return result;
}

/* ----------------------------------------------------------- dispatching */
static int best_isa(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return ISA_AVX2; /* every AVX2 x86 CPU also has F16C */
    return ISA_NONE;
}

static const char *isa_name(int isa)
{
    return isa == ISA_AVX512 ? "avx512" : isa == ISA_AVX2 ? "avx2" : "none";
}

static int isa_from_name(const char *name)
{
    if (strcmp(name, "avx512") == 0) return ISA_AVX512;
    if (strcmp(name, "avx2") == 0) return ISA_AVX2;
    return -1;
}

static Py_ssize_t packed_bytes(int kind, Py_ssize_t cols, Py_ssize_t depth)
{
    if (kind == KIND_F32) return (cols + 2 * PANEL - 1) / (2 * PANEL) * depth * 2 * PANEL * (Py_ssize_t)sizeof(float);
    const Py_ssize_t panels = (cols + PANEL - 1) / PANEL;
    const Py_ssize_t block_bytes = kind == KIND_Q4_1 ? Q4_1_PANEL_BLOCK_BYTES : Q8_0_PANEL_BLOCK_BYTES;
    return panels * (depth / QBLOCK) * block_bytes;
}

static PyObject *py_best_isa(PyObject *self, PyObject *noargs)
{
    return PyUnicode_FromString(isa_name(best_isa()));
}

/* gemm(kind, x, packed, out, rows, cols, depth, isa, threads) */
static PyObject *py_gemm(PyObject *self, PyObject *args)
{
    int kind, threads;
    Py_buffer x, packed, out;
    Py_ssize_t rows, cols, depth;
    const char *isa_str;
    if (!PyArg_ParseTuple(args, "iy*y*w*nnnsi", &kind, &x, &packed, &out, &rows, &cols, &depth, &isa_str,
                          &threads))
        return NULL;
    PyObject *result = NULL;
    const int isa = isa_from_name(isa_str);
    if (kind != KIND_Q4_1 && kind != KIND_Q8_0 && kind != KIND_F32) {
        PyErr_Format(PyExc_ValueError, "unknown weight kind %d", kind);
    } else if (isa < 0 || isa > best_isa()) {
        PyErr_Format(PyExc_ValueError, "instruction set %s is not available (best: %s)", isa_str,
                     isa_name(best_isa()));
    } else if (rows < 0 || cols <= 0 || depth <= 0 || (kind != KIND_F32 && depth % QBLOCK != 0)) {
        PyErr_Format(PyExc_ValueError,
                     "bad shape rows=%zd cols=%zd depth=%zd (quantised depth must be a multiple of %d)", rows, cols,
                     depth, QBLOCK);
    } else if (x.len != rows * depth * (Py_ssize_t)sizeof(float) ||
               out.len != rows * cols * (Py_ssize_t)sizeof(float) ||
               packed.len != packed_bytes(kind, cols, depth)) {
        PyErr_Format(PyExc_ValueError, "buffer sizes do not match rows=%zd cols=%zd depth=%zd", rows, cols,
                     depth);
    } else {
        const struct gemm_args a = {x.buf, packed.buf, out.buf, rows, cols, depth, kind};
        const Py_ssize_t panels = (cols + PANEL - 1) / PANEL;
        Py_BEGIN_ALLOW_THREADS
        if (rows > 0) {
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
            {
                float *weights = kind == KIND_F32 ? NULL : aligned_alloc(64, (size_t)depth * 2 * PANEL * sizeof(float));
                /* panels in pairs: the AVX-512 many-rows kernel computes two at once */
#pragma omp for schedule(static)
                for (Py_ssize_t pair = 0; pair < (panels + 1) / 2; pair++) {
                    const int count = 2 * pair + 1 < panels ? 2 : 1;
                    if (isa == ISA_AVX512)
                        avx512_panels(&a, 2 * pair, count, weights);
                    else
                        for (int i = 0; i < count; i++) avx2_panel(&a, 2 * pair + i, weights);
                }
                free(weights);
            }
        }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&packed);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"best_isa", py_best_isa, METH_NOARGS, "The widest instruction set this CPU runs: avx512, avx2 or none."},
    {"attention", py_attention, METH_VARARGS, "Paged causal attention over block tables (see _native.c)."},
    {"rms_norm", py_rms_norm, METH_VARARGS, "RMSNorm of x (+ residual), row by row."},
    {"rotary", py_rotary, METH_VARARGS, "Rotate-half rotary embedding of [tokens, heads, head_dim]."},
    {"silu_and_mul", py_silu_and_mul, METH_VARARGS, "silu(gate) * up of [gate | up] rows."},
    {"gemm", py_gemm, METH_VARARGS,
     "gemm(kind, x, packed, out, rows, cols, depth, isa, threads): out = x @ dequant(packed).T"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "Native cpu-backend kernels.", -1, methods};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "KIND_Q4_1", KIND_Q4_1) < 0 || PyModule_AddIntConstant(m, "KIND_Q8_0", KIND_Q8_0) < 0 ||
        PyModule_AddIntConstant(m, "KIND_F32", KIND_F32) < 0 ||
        PyModule_AddIntConstant(m, "PANEL", PANEL) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
