/*
 * Matrix products out = x @ W.T on weights kept in GGUF blocks or float32 panels.
 *
 * Why: a decode step of a small model reads every weight once. Read as float32 that is four
 * bytes a weight; read in the GGUF's own Q4_1/Q8_0 blocks it is 0.625/1.06 bytes. The blocks are
 * dequantised in registers to exactly the float32 values `gguf.quants.dequantize` produces
 * (d*q+m and d*q are exact products rounded once), then multiplied in float32 with float32
 * activations, so results equal a float32 matmul on the dequantised weights up to summation order.
 *
 * Weights are repacked at load time (packing.c; float32 in native/__init__.py) into panels of 16
 * output columns:
 *   Q4_1 panel block (320 bytes, 32 k x 16 columns):
 *     d[16] fp16, m[16] fp16, then 16 rows j of 16 bytes: byte n = q[2j][n] | q[2j+1][n] << 4
 *   Q8_0 panel block (544 bytes): d[16] fp16, then 32 rows k of 16 int8 q[k][n]
 * A panel's blocks follow each other along k, panels along n.
 *   float32 weights (KIND_F32, any depth) are stored as pairs of panels, [pairs][k][32 columns],
 *   with the columns padded to a multiple of 32: already the kernels' float buffer layout.
 *
 * Two instruction sets are compiled with target attributes and chosen at run time: AVX-512
 * (16 columns in one register; tiles of 16 rows from the blocks, 12 rows x 2 panels from floats)
 * and AVX2+FMA+F16C (two registers per panel; 4 rows from the blocks, 6 from floats). Work is
 * split over pairs of panels (threadpool.c); the GIL is released. With few rows (decode) a panel
 * alone is one chain of dependent FMAs per row and column block, bound by the FMA latency rather
 * than by reading the weights: up to 8 rows (AVX-512) or 2 (AVX2) take both panels of the pair
 * in one pass, twice the independent chains, the same sums in the same order (one row, one
 * thread, weights in L2: +10-30% weights per second on either instruction set).
 */
#include "native.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define QBLOCK 32
#define Q4_1_PANEL_BLOCK_BYTES (PANEL * 2 * 2 + PANEL * QBLOCK / 2)
#define Q8_0_PANEL_BLOCK_BYTES (PANEL * 2 + PANEL * QBLOCK)

/* The few-rows kernels read each weight once, as fast as they compute, and their loads wait on memory:
 * the next blocks of each panel are asked for PREFETCH_BLOCKS blocks ahead (1-4 measured alike,
 * +6-9% decode on SmolLM2; 8 was slower). A prefetch past a panel's end never faults. */
#define PREFETCH_BLOCKS 2
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *block, Py_ssize_t bytes)
{
    for (Py_ssize_t line = 0; line < bytes; line += 64) _mm_prefetch((const char *)block + line, _MM_HINT_T0);
}

/* Each instruction set has: dequantisation of one k row of a panel block (16 columns), a tile
 * kernel multiplying up to ROWS activation rows by one panel straight from its blocks (few rows:
 * every weight is used by few rows, so it is dequantised where it is used), and a tile kernel over
 * a panel dequantised once into a float buffer (many rows: the buffer is reused by every row
 * tile). Both produce the same float32 weights and sum over k in the same order. */
#define BLOCK_BYTES(kind) ((kind) == KIND_Q4_1 || (kind) == KIND_Q4_1_I8 ? Q4_1_PANEL_BLOCK_BYTES : Q8_0_PANEL_BLOCK_BYTES)

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
        const __m512 bias = a->bias ? _mm512_maskz_loadu_ps(mask, a->bias + start) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++)
            _mm512_mask_storeu_ps(a->out + (row0 + r) * a->cols + start, mask, _mm512_add_ps(acc[r * width + i], bias));
    }
}

/* `width` panels (1 or 2, adjacent in memory, the first at `panel`) straight from their blocks for
 * `rows` rows. Each output column is one chain of FMAs along k; with one row a panel's chain alone
 * waits on the FMA latency, so few rows take two panels at once (two independent chains per row). */
static inline __attribute__((always_inline)) AVX512_TARGET void
avx512_tile_blocks(const struct gemm_args *a, const uint8_t *panel, int width, Py_ssize_t row0, int rows,
                   Py_ssize_t col0)
{
    __m512 acc[AVX512_ROWS];
    for (int i = 0; i < rows * width; i++) acc[i] = _mm512_setzero_ps();
    const float *x = a->x + row0 * a->depth;
    const Py_ssize_t blocks = a->depth / QBLOCK, block_bytes = BLOCK_BYTES(a->kind);
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const float *xb = x + b * QBLOCK;
        const uint8_t *blk[2] = {panel + b * block_bytes, panel + (blocks + b) * block_bytes};
        for (int i = 0; i < width; i++) prefetch_block(blk[i] + PREFETCH_BLOCKS * block_bytes, block_bytes);
        __m512 d[2], m[2];
        for (int i = 0; i < width; i++) {
            d[i] = avx512_scales(blk[i], 0);
            m[i] = a->kind == KIND_Q4_1 ? avx512_scales(blk[i], 32) : _mm512_setzero_ps();
        }
#define ACCUMULATE(k, w)                                                                                    \
    for (int r = 0; r < rows; r++) {                                                                         \
        const __m512 xv_ = _mm512_set1_ps(xb[r * a->depth + (k)]);                                          \
        for (int i = 0; i < width; i++) acc[r * width + i] = _mm512_fmadd_ps(xv_, (w)[i], acc[r * width + i]); \
    }
        if (a->kind == KIND_Q4_1) {
            for (int j = 0; j < QBLOCK / 2; j++) {
                __m512 even[2], odd[2];
                for (int i = 0; i < width; i++) avx512_q4_1_pair(blk[i], j, d[i], m[i], &even[i], &odd[i]);
                ACCUMULATE(2 * j, even);
                ACCUMULATE(2 * j + 1, odd);
            }
        } else {
            for (int k = 0; k < QBLOCK; k++) {
                __m512 w[2];
                for (int i = 0; i < width; i++) w[i] = avx512_q8_0_row(blk[i], k, d[i]);
                ACCUMULATE(k, w);
            }
        }
#undef ACCUMULATE
    }
    avx512_store(a, acc, row0, rows, col0, width);
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

#define AVX512_BLOCKS_CASE(n, width) case n: avx512_tile_blocks(a, panel, width, row0, n, col0); break;
#define AVX512_FLOATS_CASE(n, width) case n: avx512_tile_floats(a, weights, ld, width, row0, n, col0); break;
/* rows per tile: 16 accumulators for one panel, 24 for two (12 rows) */
#define AVX512_PAIR_ROWS 12
/* up to this many rows go through both panels of a pair at once straight from the blocks */
#define AVX512_WIDE_ROWS 8

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
        if (count == 2 && a->rows <= AVX512_WIDE_ROWS) {
            const uint8_t *panel = a->packed + p * blocks * BLOCK_BYTES(a->kind);
            const Py_ssize_t row0 = 0, col0 = p * PANEL;
            switch ((int)a->rows) {
                AVX512_BLOCKS_CASE(1, 2) AVX512_BLOCKS_CASE(2, 2) AVX512_BLOCKS_CASE(3, 2) AVX512_BLOCKS_CASE(4, 2)
                AVX512_BLOCKS_CASE(5, 2) AVX512_BLOCKS_CASE(6, 2) AVX512_BLOCKS_CASE(7, 2) AVX512_BLOCKS_CASE(8, 2)
            }
            return;
        }
        for (int i = 0; i < count; i++) {
            const uint8_t *panel = a->packed + (p + i) * blocks * BLOCK_BYTES(a->kind);
            const Py_ssize_t col0 = (p + i) * PANEL;
            for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX512_ROWS) {
                const Py_ssize_t left = a->rows - row0;
                /* constant row counts let the compiler keep every accumulator in a register */
                switch (left < AVX512_ROWS ? (int)left : AVX512_ROWS) {
                    AVX512_BLOCKS_CASE(1, 1) AVX512_BLOCKS_CASE(2, 1) AVX512_BLOCKS_CASE(3, 1) AVX512_BLOCKS_CASE(4, 1)
                    AVX512_BLOCKS_CASE(5, 1) AVX512_BLOCKS_CASE(6, 1) AVX512_BLOCKS_CASE(7, 1) AVX512_BLOCKS_CASE(8, 1)
                    AVX512_BLOCKS_CASE(9, 1) AVX512_BLOCKS_CASE(10, 1) AVX512_BLOCKS_CASE(11, 1)
                    AVX512_BLOCKS_CASE(12, 1) AVX512_BLOCKS_CASE(13, 1) AVX512_BLOCKS_CASE(14, 1)
                    AVX512_BLOCKS_CASE(15, 1) AVX512_BLOCKS_CASE(16, 1)
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
#define AVX2_ROWS 4       /* rows per tile straight from the blocks: 8 accumulators + dequantisation */
#define AVX2_FLOAT_ROWS 6 /* rows per tile from float weights: 12 accumulators (of 16 registers) */
#define AVX2_WIDE_ROWS 2  /* up to this many rows go through both panels of a pair at once */

/* A panel block's scales (and Q4_1 minimums) as floats, columns 0-7 and 8-15. */
struct avx2_scales {
    __m256 d_lo, d_hi, m_lo, m_hi;
};

static inline __attribute__((always_inline)) AVX2_TARGET struct avx2_scales avx2_block_scales(int kind,
                                                                                            const uint8_t *blk)
{
    struct avx2_scales sc;
    sc.d_lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
    sc.d_hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
    sc.m_lo = sc.m_hi = _mm256_setzero_ps();
    if (kind == KIND_Q4_1) {
        sc.m_lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32)));
        sc.m_hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 48)));
    }
    return sc;
}

/* the 16 weights of row k (0..31) of a panel block, as columns 0-7 and 8-15 */
static inline __attribute__((always_inline)) AVX2_TARGET void
avx2_weights(int kind, const uint8_t *blk, int k, const struct avx2_scales *sc, __m256 *lo, __m256 *hi)
{
    if (kind == KIND_Q4_1) {
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + 64 + 16 * (k / 2)));
        if (k % 2) q = _mm_srli_epi16(q, 4);
        q = _mm_and_si128(q, _mm_set1_epi8(0x0F));
        *lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), sc->d_lo, sc->m_lo);
        *hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))), sc->d_hi, sc->m_hi);
        return;
    }
    const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 32 + 16 * k));
    *lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), sc->d_lo);
    *hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), sc->d_hi);
}

static inline __attribute__((always_inline)) AVX2_TARGET void
avx2_store(const struct gemm_args *a, const __m256 *lo, const __m256 *hi, Py_ssize_t row0, int rows, Py_ssize_t col0)
{
    const Py_ssize_t valid = a->cols - col0 < PANEL ? a->cols - col0 : PANEL;
    float bias[PANEL] = {0};
    if (a->bias) memcpy(bias, a->bias + col0, (size_t)valid * sizeof(float));
    const __m256 bias_lo = _mm256_loadu_ps(bias), bias_hi = _mm256_loadu_ps(bias + 8);
    /* unrolled, so lo[r] and hi[r] are registers rather than an array GCC must keep in memory */
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        float *dst = a->out + (row0 + r) * a->cols + col0;
        float tmp[PANEL];
        _mm256_storeu_ps(tmp, _mm256_add_ps(lo[r], bias_lo));
        _mm256_storeu_ps(tmp + 8, _mm256_add_ps(hi[r], bias_hi));
        memcpy(dst, tmp, (size_t)valid * sizeof(float));
    }
}

/* lo/hi[r] += x[r * depth] * (w_lo, w_hi) for the tile's rows (unrolled: registers, not memory). */
static inline __attribute__((always_inline)) AVX2_TARGET void
avx2_accumulate(__m256 *lo, __m256 *hi, const float *x, Py_ssize_t depth, int rows, __m256 w_lo, __m256 w_hi)
{
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        const __m256 xv = _mm256_broadcast_ss(x + r * depth);
        lo[r] = _mm256_fmadd_ps(xv, w_lo, lo[r]);
        hi[r] = _mm256_fmadd_ps(xv, w_hi, hi[r]);
    }
}

static inline __attribute__((always_inline)) AVX2_TARGET void
avx2_tile_blocks(const struct gemm_args *a, const uint8_t *panel, Py_ssize_t row0, int rows, Py_ssize_t col0)
{
    __m256 lo[AVX2_ROWS], hi[AVX2_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    const Py_ssize_t depth = a->depth;
    const int kind = a->kind;
    const float *x = a->x + row0 * depth;
    for (Py_ssize_t b = 0; b < depth / QBLOCK; b++) {
        const uint8_t *blk = panel + b * BLOCK_BYTES(kind);
        prefetch_block(blk + PREFETCH_BLOCKS * BLOCK_BYTES(kind), BLOCK_BYTES(kind));
        const struct avx2_scales sc = avx2_block_scales(kind, blk);
        /* unrolled: the Q4_1 nibble choice (j % 2) and load offset (j / 2) become constants */
#pragma GCC unroll 32
        for (int j = 0; j < QBLOCK; j++) {
            const Py_ssize_t k = b * QBLOCK + j;
            __m256 w_lo, w_hi;
            avx2_weights(kind, blk, j, &sc, &w_lo, &w_hi);
            avx2_accumulate(lo, hi, x + k, depth, rows, w_lo, w_hi);
        }
    }
    avx2_store(a, lo, hi, row0, rows, col0);
}

/* One panel from float weights whose row k starts at weights + k * ld. */
static inline __attribute__((always_inline)) AVX2_TARGET void
avx2_tile_floats(const struct gemm_args *a, const float *weights, Py_ssize_t ld, Py_ssize_t row0, int rows,
                 Py_ssize_t col0)
{
    __m256 lo[AVX2_FLOAT_ROWS], hi[AVX2_FLOAT_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    const Py_ssize_t depth = a->depth; /* a local: the loop must not re-read it through `a` */
    const float *x = a->x + row0 * depth;
    for (Py_ssize_t k = 0; k < depth; k++) {
        const __m256 w_lo = _mm256_loadu_ps(weights + k * ld), w_hi = _mm256_loadu_ps(weights + k * ld + 8);
        avx2_accumulate(lo, hi, x + k, depth, rows, w_lo, w_hi);
    }
    avx2_store(a, lo, hi, row0, rows, col0);
}

/* Both panels of pair p (adjacent in memory) straight from their blocks for `rows` <= AVX2_WIDE_ROWS
 * rows: four independent FMA chains per row where one panel alone has two, which wait on the FMA
 * latency (the sums are those of avx2_tile_blocks, in the same order). */
static inline __attribute__((always_inline)) AVX2_TARGET void avx2_pair_blocks(const struct gemm_args *a,
                                                                               Py_ssize_t p, int rows)
{
    __m256 lo0[AVX2_WIDE_ROWS], hi0[AVX2_WIDE_ROWS], lo1[AVX2_WIDE_ROWS], hi1[AVX2_WIDE_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) lo0[r] = hi0[r] = lo1[r] = hi1[r] = _mm256_setzero_ps();
    const Py_ssize_t depth = a->depth, blocks = depth / QBLOCK;
    const int kind = a->kind;
    const Py_ssize_t block_bytes = BLOCK_BYTES(kind);
    const uint8_t *panel = a->packed + p * blocks * block_bytes;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const uint8_t *blk0 = panel + b * block_bytes, *blk1 = panel + (blocks + b) * block_bytes;
        prefetch_block(blk0 + PREFETCH_BLOCKS * block_bytes, block_bytes);
        prefetch_block(blk1 + PREFETCH_BLOCKS * block_bytes, block_bytes);
        const struct avx2_scales sc0 = avx2_block_scales(kind, blk0), sc1 = avx2_block_scales(kind, blk1);
#pragma GCC unroll 32
        for (int j = 0; j < QBLOCK; j++) {
            const float *xk = a->x + b * QBLOCK + j;
            __m256 w_lo0, w_hi0, w_lo1, w_hi1;
            avx2_weights(kind, blk0, j, &sc0, &w_lo0, &w_hi0);
            avx2_weights(kind, blk1, j, &sc1, &w_lo1, &w_hi1);
            avx2_accumulate(lo0, hi0, xk, depth, rows, w_lo0, w_hi0);
            avx2_accumulate(lo1, hi1, xk, depth, rows, w_lo1, w_hi1);
        }
    }
    avx2_store(a, lo0, hi0, 0, rows, p * PANEL);
    avx2_store(a, lo1, hi1, 0, rows, (p + 1) * PANEL);
}

#define AVX2_BLOCKS_CASE(n) case n: avx2_tile_blocks(a, panel, row0, n, col0); break;
#define AVX2_FLOATS_CASE(n) case n: avx2_tile_floats(a, weights, ld, row0, n, col0); break;

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
        for (Py_ssize_t b = 0; b < a->depth / QBLOCK; b++) {
            const uint8_t *blk = panel + b * BLOCK_BYTES(a->kind);
            const struct avx2_scales sc = avx2_block_scales(a->kind, blk);
            /* unrolled: the Q4_1 nibble choice (j % 2) and load offset (j / 2) become constants */
#pragma GCC unroll 32
            for (int j = 0; j < QBLOCK; j++) {
                __m256 w_lo, w_hi;
                avx2_weights(a->kind, blk, j, &sc, &w_lo, &w_hi);
                _mm256_storeu_ps(weights + (b * QBLOCK + j) * PANEL, w_lo);
                _mm256_storeu_ps(weights + (b * QBLOCK + j) * PANEL + 8, w_hi);
            }
        }
    }
    const int tile = weights ? AVX2_FLOAT_ROWS : AVX2_ROWS;
    for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += tile) {
        const int rows = a->rows - row0 < tile ? (int)(a->rows - row0) : tile;
        if (weights) {
            switch (rows) {
                AVX2_FLOATS_CASE(1) AVX2_FLOATS_CASE(2) AVX2_FLOATS_CASE(3)
                AVX2_FLOATS_CASE(4) AVX2_FLOATS_CASE(5) AVX2_FLOATS_CASE(6)
            }
        } else {
            switch (rows) { AVX2_BLOCKS_CASE(1) AVX2_BLOCKS_CASE(2) AVX2_BLOCKS_CASE(3) AVX2_BLOCKS_CASE(4) }
        }
    }
}

/* Pair p from its blocks for up to AVX2_WIDE_ROWS rows (constant row counts: accumulators in registers). */
static AVX2_TARGET void avx2_pair(const struct gemm_args *a, Py_ssize_t p)
{
    if (a->rows == 1)
        avx2_pair_blocks(a, p, 1);
    else
        avx2_pair_blocks(a, p, 2);
}

/* ----------------------------------------------------------- dispatching */
Py_ssize_t fd_packed_bytes(int kind, Py_ssize_t cols, Py_ssize_t depth)
{
    if (kind == KIND_F32) return (cols + 2 * PANEL - 1) / (2 * PANEL) * depth * 2 * PANEL * (Py_ssize_t)sizeof(float);
    const Py_ssize_t panels = (cols + PANEL - 1) / PANEL;
    return panels * (depth / QBLOCK) * BLOCK_BYTES(kind);
}

/* One task: a pair of panels (the AVX-512 many-rows kernel computes two at once). */
struct gemm_job {
    struct gemm_args a;
    Py_ssize_t panels;
    int isa;
};

static void gemm_task(void *ctx, Py_ssize_t pair, int slot)
{
    struct gemm_job *job = ctx;
    const struct gemm_args *a = &job->a;
    float *weights = NULL;
    /* without scratch memory the kernels read the blocks directly */
    if (a->kind != KIND_F32 && a->rows > AVX2_ROWS) weights = fd_thread_scratch((size_t)a->depth * 2 * PANEL * sizeof(float));
    const int count = 2 * pair + 1 < job->panels ? 2 : 1;
    if (job->isa == ISA_AVX512)
        avx512_panels(a, 2 * pair, count, weights);
    else if (count == 2 && a->kind != KIND_F32 && a->rows <= AVX2_WIDE_ROWS)
        avx2_pair(a, 2 * pair);
    else
        for (int i = 0; i < count; i++) avx2_panel(a, 2 * pair + i, weights);
    (void)slot;
}

int fd_gemm(const struct gemm_args *a, int isa, int threads)
{
    if (a->rows <= 0) return 0;
    if (a->kind == KIND_Q4_1_I8 || a->kind == KIND_Q8_0_I8) return gemm_int8(a, isa, threads);
    struct gemm_job job = {*a, (a->cols + PANEL - 1) / PANEL, isa};
    fd_parallel_for((job.panels + 1) / 2, threads, gemm_task, &job);
    return 0;
}

/* gemm(kind, x, packed, out, rows, cols, depth, isa, threads[, bias or None]) */
PyObject *native_gemm(PyObject *self, PyObject *args)
{
    int kind, threads;
    Py_buffer x, packed, out, bias = {0};
    PyObject *bias_obj = Py_None;
    Py_ssize_t rows, cols, depth;
    const char *isa_str;
    if (!PyArg_ParseTuple(args, "iy*y*w*nnnsi|O", &kind, &x, &packed, &out, &rows, &cols, &depth, &isa_str,
                          &threads, &bias_obj))
        return NULL;
    PyObject *result = NULL;
    const int isa = native_isa_checked(isa_str);
    if (bias_obj != Py_None && PyObject_GetBuffer(bias_obj, &bias, PyBUF_SIMPLE) < 0) {
        /* PyObject_GetBuffer set the error */
    } else if (bias.obj && bias.len != cols * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "bias has %zd bytes, expected cols=%zd float32 values", bias.len, cols);
    } else if (isa < 0) {
        /* native_isa_checked set the error */
    } else if (kind < KIND_Q4_1 || kind > KIND_Q8_0_I8) {
        PyErr_Format(PyExc_ValueError, "unknown weight kind %d", kind);
    } else if (rows < 0 || cols <= 0 || depth <= 0 || (kind != KIND_F32 && depth % QBLOCK != 0)) {
        PyErr_Format(PyExc_ValueError,
                     "bad shape rows=%zd cols=%zd depth=%zd (quantised depth must be a multiple of %d)", rows, cols,
                     depth, QBLOCK);
    } else if (x.len != rows * depth * (Py_ssize_t)sizeof(float) ||
               out.len != rows * cols * (Py_ssize_t)sizeof(float) ||
               packed.len != fd_packed_bytes(kind, cols, depth)) {
        PyErr_Format(PyExc_ValueError, "buffer sizes do not match rows=%zd cols=%zd depth=%zd", rows, cols,
                     depth);
    } else {
        const struct gemm_args a = {x.buf, packed.buf, out.buf, rows, cols, depth, kind, bias.obj ? bias.buf : NULL};
        int failed;
        Py_BEGIN_ALLOW_THREADS
        failed = fd_gemm(&a, isa, threads);
        Py_END_ALLOW_THREADS
        result = failed ? PyErr_NoMemory() : Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&packed);
    PyBuffer_Release(&out);
    if (bias.obj) PyBuffer_Release(&bias);
    return result;
}
