/*
 * Matrix products out = x @ W.T on weights kept in GGUF blocks or float32 panels.
 *
 * Why: a decode step of a small model reads every weight once. Read as float32 that is four
 * bytes a weight; read in the GGUF's own Q4_1/Q8_0 blocks it is 0.625/1.06 bytes. Activations stay
 * float32 and every product is float32 arithmetic on the blocks' exact values.
 *
 * Fold: a block's weights are d*q + m (Q4_1; d*q for Q8_0) with q small integers, so for each row,
 * column and block of 32 k the kernels compute the sum s = x.q (a chain of FMAs along k, q as
 * floats) and fold it into the column's total:
 *     total = fma(d, s, total);  then, Q4_1 only:  total = fma(m, sum of the block's 32 x, total)
 * starting from total = 0, block after block. Scaling whole block sums instead of each weight
 * saves one FMA per weight, which one-row products (decode) are short of. The block sums of x are
 * computed once per product (block_sums_rows), in one fixed order. Every kernel below does exactly
 * these operations in this order, so a row's result does not depend on how many rows share the
 * call (batch invariance) nor on the ISA. Tests check every row count bit for bit against the
 * many-rows path on each ISA; that the two ISAs agree is not tested. The result equals a float32
 * product of the dequantised weights up to rounding (a float64 reference test bounds it).
 *
 * Weights are repacked at load time (packing.c; float32 in native/__init__.py) into panels of 16
 * output columns:
 *   Q4_1 panel block (320 bytes, 32 k x 16 columns):
 *     d[16] fp16, m[16] fp16, then 16 rows j of 16 bytes: byte n = q[2j][n] | q[2j+1][n] << 4
 *   Q8_0 panel block (544 bytes): d[16] fp16, then 32 rows k of 16 int8 q[k][n]
 * A panel's blocks follow each other along k, panels along n.
 *   float32 weights (KIND_F32, any depth) are stored as pairs of panels, [pairs][k][32 columns],
 *   with the columns padded to a multiple of 32: already the kernels' float buffer layout; they
 *   have no blocks and sum along the whole depth in one chain.
 *
 * Two instruction sets are compiled with target attributes and chosen at run time: AVX-512
 * (16 columns in one register) and AVX2+FMA+F16C (two registers per panel). Work is split over
 * tasks of two panels (threadpool.c); the GIL is released. Kernel shapes, by rows:
 *   - one Q4_1 row: four panels at once (each column's block sum is a chain of dependent FMAs, so
 *     one panel alone waits on the FMA latency; four give four to eight independent chains);
 *   - few rows (up to 4 with AVX-512, 2 with AVX2): both panels of the pair at once; up to 16
 *     (AVX-512) or 4 (AVX2) rows: one panel at a time, straight from the blocks;
 *   - more rows: the pair's integers are converted once into a per-thread float buffer, which every
 *     row tile then reads.
 */
#include "native.h"
#include "blocks.h"

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

/* Each instruction set has: the integers of one k row of a panel block as floats (16 columns), the
 * fold, a tile kernel straight from the blocks (few rows: each weight is converted where it is
 * used) and one over the float buffer (many rows: the buffer is reused by every row tile). */
#define BLOCK_BYTES(kind) ((kind) == KIND_Q4_1 || (kind) == KIND_Q4_1_I8 ? Q4_1_PANEL_BLOCK_BYTES : Q8_0_PANEL_BLOCK_BYTES)

/* ---------------------------------------------------------------- AVX-512 */
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define AVX512_FEW_ROWS 16  /* up to this many rows read the blocks directly */
#define AVX512_TILE_ROWS 8  /* rows per tile from the blocks, one panel: 8 block sums + 8 totals */
#define AVX512_WIDE_ROWS 4  /* up to this many rows go through both panels of a pair at once */
#define AVX512_MAX_WIDTH 4  /* one row goes through four panels at once (QUAD_PANELS) */
#define AVX512_PAIR_ROWS 6  /* rows per tile over two dequantised panels: 12 block sums + 12 totals */
#define AVX512_F32_ROWS 12  /* rows per tile over two float32 panels (no block totals): 24 sums */

/* The integers q of a panel block's k rows 2j and 2j+1 (Q4_1) or of row k (Q8_0), as floats: the
 * scales are applied to whole block sums (fold). Q4_1's 16 bytes are widened once to 32-bit lanes,
 * byte = q[2j] | q[2j+1] << 4, which a mask and a shift then split (no masking before widening). */
static inline __attribute__((always_inline)) AVX512_TARGET void avx512_q4_1_pair(const uint8_t *blk, int j,
                                                                                __m512 *even, __m512 *odd)
{
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 64 + 16 * j)));
    *even = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0F)));
    *odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
}

static inline __attribute__((always_inline)) AVX512_TARGET __m512 avx512_q8_0_row(const uint8_t *blk, int k)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * k))));
}

static inline __attribute__((always_inline)) AVX512_TARGET __m512 avx512_scales(const uint8_t *blk, int offset)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + offset)));
}

/* Block b's sums x.q of the tile's rows folded into their totals for panel i of `width` (see fold
 * in the header comment); `blk` is that panel's block b, whose scales (and Q4_1 minimums) are read
 * into registers once. Every AVX-512 tile folds through here, so all do the same arithmetic. */
static inline __attribute__((always_inline)) AVX512_TARGET void
avx512_fold(const struct gemm_args *a, const uint8_t *blk, const float *block_sums, Py_ssize_t b, int rows, int width,
            int i, __m512 *total, const __m512 *sum)
{
    const Py_ssize_t blocks = a->depth / QBLOCK;
    const __m512 d = avx512_scales(blk, 0), m = a->kind == KIND_Q4_1 ? avx512_scales(blk, 32) : d;
    for (int r = 0; r < rows; r++) {
        const __m512 t = _mm512_fmadd_ps(d, sum[r * width + i], total[r * width + i]);
        total[r * width + i] =
            a->kind == KIND_Q4_1 ? _mm512_fmadd_ps(m, _mm512_set1_ps(block_sums[r * blocks + b]), t) : t;
    }
}

/* Calls STEP(k, q) for the 32 k rows of a panel block, in order, with their integers q as floats. */
#define AVX512_FOR_BLOCK_ROWS(kind, blk, STEP)                                      \
    do {                                                                            \
        if ((kind) == KIND_Q4_1) {                                                  \
            for (int j_ = 0; j_ < QBLOCK / 2; j_++) {                               \
                __m512 even_, odd_;                                                 \
                avx512_q4_1_pair(blk, j_, &even_, &odd_);                           \
                STEP(2 * j_, even_);                                                \
                STEP(2 * j_ + 1, odd_);                                             \
            }                                                                       \
        } else {                                                                    \
            for (int k_ = 0; k_ < QBLOCK; k_++) STEP(k_, avx512_q8_0_row(blk, k_)); \
        }                                                                           \
    } while (0)

/* Stores acc[r * width + i], the rows' totals for panel i of the tile starting at column col0. */
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

/* sum[r * width + i] += x[r][k] * w[i] for the tile's rows */
#define AVX512_ACCUMULATE(sum, x, depth, rows, width, k, w)                                                       \
    for (int r_ = 0; r_ < (rows); r_++) {                                                                         \
        const __m512 xv_ = _mm512_set1_ps((x)[r_ * (depth) + (k)]);                                               \
        for (int i_ = 0; i_ < (width); i_++) (sum)[r_ * (width) + i_] = _mm512_fmadd_ps(xv_, (w)[i_], (sum)[r_ * (width) + i_]); \
    }

/* `width` panels (1, 2 or 4, adjacent in memory, the first at `panel`) straight from their blocks
 * for `rows` rows. Each column's block sum is one chain of FMAs; with one row a panel's chain alone
 * waits on the FMA latency, so few rows take several panels at once (independent chains per row). */
static inline __attribute__((always_inline)) AVX512_TARGET void
avx512_tile_blocks(const struct gemm_args *a, const uint8_t *panel, int width, Py_ssize_t row0, int rows,
                   Py_ssize_t col0)
{
    __m512 total[AVX512_TILE_ROWS];
    for (int i = 0; i < rows * width; i++) total[i] = _mm512_setzero_ps();
    const Py_ssize_t depth = a->depth, blocks = depth / QBLOCK, block_bytes = BLOCK_BYTES(a->kind);
    const float *x = a->x + row0 * depth, *block_sums = a->block_sums ? a->block_sums + row0 * blocks : NULL;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const float *xb = x + b * QBLOCK;
        const uint8_t *blk[AVX512_MAX_WIDTH];
        for (int i = 0; i < width; i++) {
            blk[i] = panel + (i * blocks + b) * block_bytes;
            prefetch_block(blk[i] + PREFETCH_BLOCKS * block_bytes, block_bytes);
        }
        __m512 sum[AVX512_TILE_ROWS];
        for (int i = 0; i < rows * width; i++) sum[i] = _mm512_setzero_ps();
        if (a->kind == KIND_Q4_1) {
            for (int j = 0; j < QBLOCK / 2; j++) {
                __m512 even[AVX512_MAX_WIDTH], odd[AVX512_MAX_WIDTH];
                for (int i = 0; i < width; i++) avx512_q4_1_pair(blk[i], j, &even[i], &odd[i]);
                AVX512_ACCUMULATE(sum, xb, depth, rows, width, 2 * j, even);
                AVX512_ACCUMULATE(sum, xb, depth, rows, width, 2 * j + 1, odd);
            }
        } else {
            for (int k = 0; k < QBLOCK; k++) {
                __m512 w[AVX512_MAX_WIDTH];
                for (int i = 0; i < width; i++) w[i] = avx512_q8_0_row(blk[i], k);
                AVX512_ACCUMULATE(sum, xb, depth, rows, width, k, w);
            }
        }
        for (int i = 0; i < width; i++) avx512_fold(a, blk[i], block_sums, b, rows, width, i, total, sum);
    }
    avx512_store(a, total, row0, rows, col0, width);
}

/* `width` panels whose integers were written as floats to `weights` (row k at weights + k * ld), for
 * up to AVX512_PAIR_ROWS rows; the scales are read from the panels' blocks at `panel`. */
static inline __attribute__((always_inline)) AVX512_TARGET void
avx512_tile_dequantised(const struct gemm_args *a, const float *weights, Py_ssize_t ld, const uint8_t *panel,
                        int width, Py_ssize_t row0, int rows, Py_ssize_t col0)
{
    __m512 total[AVX512_PAIR_ROWS * 2];
    for (int i = 0; i < rows * width; i++) total[i] = _mm512_setzero_ps();
    const Py_ssize_t depth = a->depth, blocks = depth / QBLOCK, block_bytes = BLOCK_BYTES(a->kind);
    const float *x = a->x + row0 * depth, *block_sums = a->block_sums ? a->block_sums + row0 * blocks : NULL;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        __m512 sum[AVX512_PAIR_ROWS * 2];
        for (int i = 0; i < rows * width; i++) sum[i] = _mm512_setzero_ps();
        for (Py_ssize_t k = b * QBLOCK; k < (b + 1) * QBLOCK; k++) {
            __m512 w[2];
            for (int i = 0; i < width; i++) w[i] = _mm512_loadu_ps(weights + k * ld + i * PANEL);
            AVX512_ACCUMULATE(sum, x, depth, rows, width, k, w);
        }
        for (int i = 0; i < width; i++)
            avx512_fold(a, panel + (i * blocks + b) * block_bytes, block_sums, b, rows, width, i, total, sum);
    }
    avx512_store(a, total, row0, rows, col0, width);
}

/* `width` panels (16 columns each) from float32 weights whose row k starts at weights + k * ld. */
static inline __attribute__((always_inline)) AVX512_TARGET void
avx512_tile_floats(const struct gemm_args *a, const float *weights, Py_ssize_t ld, int width, Py_ssize_t row0,
                   int rows, Py_ssize_t col0)
{
    __m512 acc[AVX512_F32_ROWS * 2];
    for (int i = 0; i < rows * width; i++) acc[i] = _mm512_setzero_ps();
    const float *x = a->x + row0 * a->depth;
    for (Py_ssize_t k = 0; k < a->depth; k++) {
        __m512 w[2];
        for (int i = 0; i < width; i++) w[i] = _mm512_loadu_ps(weights + k * ld + i * PANEL);
        AVX512_ACCUMULATE(acc, x, a->depth, rows, width, k, w);
    }
    avx512_store(a, acc, row0, rows, col0, width);
}

/* constant row counts let the compiler keep every accumulator in a register */
#define AVX512_CASES_4(CASE, w) CASE(1, w) CASE(2, w) CASE(3, w) CASE(4, w)
#define AVX512_CASES_6(CASE, w) AVX512_CASES_4(CASE, w) CASE(5, w) CASE(6, w)
#define AVX512_CASES_8(CASE, w) AVX512_CASES_6(CASE, w) CASE(7, w) CASE(8, w)
#define AVX512_CASES_12(CASE, w) AVX512_CASES_8(CASE, w) CASE(9, w) CASE(10, w) CASE(11, w) CASE(12, w)
#define AVX512_BLOCKS_CASE(n, width) case n: avx512_tile_blocks(a, panel, width, row0, n, col0); break;
#define AVX512_DEQUANTISED_CASE(n, width) case n: avx512_tile_dequantised(a, weights, ld, panel, width, row0, n, col0); break;
#define AVX512_FLOATS_CASE(n, width) case n: avx512_tile_floats(a, weights, ld, width, row0, n, col0); break;

/* Panels p .. p+count-1 (count 1 or 2, p even) for all rows; `weights` is a depth x 32 float scratch
 * buffer for dequantised blocks. */
static AVX512_TARGET void avx512_panels(const struct gemm_args *a, Py_ssize_t p, int count, float *weights)
{
    const Py_ssize_t blocks = a->depth / QBLOCK, col0 = p * PANEL;
    if (a->kind == KIND_F32) {
        weights = (float *)a->packed + p / 2 * a->depth * 2 * PANEL;
        const Py_ssize_t ld = 2 * PANEL;
        for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX512_F32_ROWS) {
            const int rows = a->rows - row0 < AVX512_F32_ROWS ? (int)(a->rows - row0) : AVX512_F32_ROWS;
            if (count == 2)
                switch (rows) { AVX512_CASES_12(AVX512_FLOATS_CASE, 2) }
            else
                switch (rows) { AVX512_CASES_12(AVX512_FLOATS_CASE, 1) }
        }
        return;
    }
    const uint8_t *panel = a->packed + p * blocks * BLOCK_BYTES(a->kind);
    if (a->rows <= AVX512_FEW_ROWS || weights == NULL) { /* few rows (or no scratch): straight from the blocks */
        if (count == 2 && a->rows <= AVX512_WIDE_ROWS) {
            const Py_ssize_t row0 = 0;
            switch ((int)a->rows) { AVX512_CASES_4(AVX512_BLOCKS_CASE, 2) }
            return;
        }
        for (int i = 0; i < count; i++, panel += blocks * BLOCK_BYTES(a->kind)) {
            const Py_ssize_t col0 = (p + i) * PANEL;
            for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX512_TILE_ROWS) {
                const Py_ssize_t left = a->rows - row0;
                switch (left < AVX512_TILE_ROWS ? (int)left : AVX512_TILE_ROWS) { AVX512_CASES_8(AVX512_BLOCKS_CASE, 1) }
            }
        }
        return;
    }
    const Py_ssize_t ld = count * PANEL;
    for (int i = 0; i < count; i++) {
        const uint8_t *blocks_i = panel + i * blocks * BLOCK_BYTES(a->kind);
        for (Py_ssize_t b = 0; b < blocks; b++) {
            float *wb = weights + (b * QBLOCK * count + i) * PANEL;
#define STORE(k, q) _mm512_storeu_ps(wb + (k) * count * PANEL, (q))
            AVX512_FOR_BLOCK_ROWS(a->kind, blocks_i + b * BLOCK_BYTES(a->kind), STORE);
#undef STORE
        }
    }
    for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX512_PAIR_ROWS) {
        const int rows = a->rows - row0 < AVX512_PAIR_ROWS ? (int)(a->rows - row0) : AVX512_PAIR_ROWS;
        if (count == 2)
            switch (rows) { AVX512_CASES_6(AVX512_DEQUANTISED_CASE, 2) }
        else
            switch (rows) { AVX512_CASES_6(AVX512_DEQUANTISED_CASE, 1) }
    }
}

/* Four panels (adjacent, the first at `panel`) for one row: four independent FMA chains. */
static AVX512_TARGET void avx512_quad(const struct gemm_args *a, const uint8_t *panel, Py_ssize_t col0)
{
    avx512_tile_blocks(a, panel, 4, 0, 1, col0);
}

/* ------------------------------------------------------------------- AVX2 */
#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX2_ROWS 4       /* rows per tile straight from the blocks: 8 block sums + dequantisation */
#define AVX2_FLOAT_ROWS 6 /* rows per tile from float weights or the buffer: 12 sums (of 16 registers) */
#define AVX2_WIDE_ROWS 2  /* up to this many rows go through both panels of a pair at once */
#define AVX2_MAX_WIDTH 4  /* one row goes through four panels at once (QUAD_PANELS) */

/* The integers q of row k (0..31) of a panel block as floats, columns 0-7 and 8-15. */
static inline __attribute__((always_inline)) AVX2_TARGET void avx2_integers(int kind, const uint8_t *blk, int k,
                                                                           __m256 *lo, __m256 *hi)
{
    if (kind == KIND_Q4_1) {
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + 64 + 16 * (k / 2)));
        if (k % 2) q = _mm_srli_epi16(q, 4);
        q = _mm_and_si128(q, _mm_set1_epi8(0x0F));
        *lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
        *hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)));
        return;
    }
    /* two 8-byte loads: each widening reads its bytes straight from memory, no shift between */
    *lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 32 + 16 * k))));
    *hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 40 + 16 * k))));
}

/* A panel block's scales (and Q4_1 minimums) as floats, columns 0-7 and 8-15. Read once per block
 * into registers: read through the block's byte pointer, which may alias anything, they would be
 * read again after every store of a total. */
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

/* A block's sums x.q of one row folded into that row's 16 totals, kept in memory: with AVX2's 16
 * registers the block sums need them all (the same operations as avx512_fold). */
static inline __attribute__((always_inline)) AVX2_TARGET void avx2_fold(int kind, const struct avx2_scales *sc,
                                                                       float *total, __m256 lo, __m256 hi,
                                                                       float block_sum)
{
    __m256 t_lo = _mm256_fmadd_ps(sc->d_lo, lo, _mm256_loadu_ps(total));
    __m256 t_hi = _mm256_fmadd_ps(sc->d_hi, hi, _mm256_loadu_ps(total + 8));
    if (kind == KIND_Q4_1) {
        const __m256 s = _mm256_set1_ps(block_sum);
        t_lo = _mm256_fmadd_ps(sc->m_lo, s, t_lo);
        t_hi = _mm256_fmadd_ps(sc->m_hi, s, t_hi);
    }
    _mm256_storeu_ps(total, t_lo);
    _mm256_storeu_ps(total + 8, t_hi);
}

/* Stores totals[r * PANEL ...], the tile's rows for the panel at column col0. */
static inline __attribute__((always_inline)) AVX2_TARGET void avx2_store(const struct gemm_args *a, const float *totals,
                                                                        Py_ssize_t row0, int rows, Py_ssize_t col0)
{
    const Py_ssize_t valid = a->cols - col0 < PANEL ? a->cols - col0 : PANEL;
    for (int r = 0; r < rows; r++) {
        float *dst = a->out + (row0 + r) * a->cols + col0;
        for (Py_ssize_t n = 0; n < valid; n++) dst[n] = totals[r * PANEL + n] + (a->bias ? a->bias[col0 + n] : 0.0f);
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

/* `width` panels (1, 2 or 4, adjacent in memory, the first at `panel`) for `rows` rows, each block's
 * integers either read straight from the blocks or, when `buffered` (a constant at every call, so
 * each case compiles without the other), from the float buffer `weights` (row k at weights + k * ld,
 * panel i at + i * PANEL). */
static inline __attribute__((always_inline)) AVX2_TARGET void avx2_tile(const struct gemm_args *a,
                                                                       const uint8_t *panel, int buffered,
                                                                       const float *weights, Py_ssize_t ld,
                                                                       int width, Py_ssize_t row0,
                                                                       int rows, Py_ssize_t col0)
{
    float totals[AVX2_MAX_WIDTH][AVX2_FLOAT_ROWS * PANEL] __attribute__((aligned(32)));
    for (int i = 0; i < width; i++) memset(totals[i], 0, (size_t)rows * PANEL * sizeof(float));
    const int kind = a->kind;
    const Py_ssize_t depth = a->depth, blocks = depth / QBLOCK, block_bytes = BLOCK_BYTES(kind);
    const float *x = a->x + row0 * depth, *block_sums = a->block_sums ? a->block_sums + row0 * blocks : NULL;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const uint8_t *blk[AVX2_MAX_WIDTH];
        __m256 lo[AVX2_MAX_WIDTH][AVX2_FLOAT_ROWS], hi[AVX2_MAX_WIDTH][AVX2_FLOAT_ROWS];
#pragma GCC unroll 4
        for (int i = 0; i < width; i++) {
            blk[i] = panel + (i * blocks + b) * block_bytes;
            if (!buffered) prefetch_block(blk[i] + PREFETCH_BLOCKS * block_bytes, block_bytes);
#pragma GCC unroll 8
            for (int r = 0; r < rows; r++) lo[i][r] = hi[i][r] = _mm256_setzero_ps();
        }
        /* unrolled: the Q4_1 nibble choice (j % 2) and load offset (j / 2) become constants */
#pragma GCC unroll 32
        for (int j = 0; j < QBLOCK; j++) {
            const Py_ssize_t k = b * QBLOCK + j;
#pragma GCC unroll 4
            for (int i = 0; i < width; i++) {
                __m256 w_lo, w_hi;
                if (buffered) {
                    w_lo = _mm256_loadu_ps(weights + k * ld + i * PANEL);
                    w_hi = _mm256_loadu_ps(weights + k * ld + i * PANEL + 8);
                } else {
                    avx2_integers(kind, blk[i], j, &w_lo, &w_hi);
                }
                avx2_accumulate(lo[i], hi[i], x + k, depth, rows, w_lo, w_hi);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < width; i++) {
            const struct avx2_scales sc = avx2_block_scales(kind, blk[i]);
#pragma GCC unroll 8
            for (int r = 0; r < rows; r++)
                avx2_fold(kind, &sc, totals[i] + r * PANEL, lo[i][r], hi[i][r],
                          kind == KIND_Q4_1 ? block_sums[r * blocks + b] : 0.0f);
        }
    }
    for (int i = 0; i < width; i++) avx2_store(a, totals[i], row0, rows, col0 + i * PANEL);
}

/* One panel of float32 weights whose row k starts at weights + k * ld (no blocks: one chain per column). */
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
    float totals[AVX2_FLOAT_ROWS * PANEL] __attribute__((aligned(32)));
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        _mm256_store_ps(totals + r * PANEL, lo[r]);
        _mm256_store_ps(totals + r * PANEL + 8, hi[r]);
    }
    avx2_store(a, totals, row0, rows, col0);
}

/* Four panels (adjacent, the first at `panel`) for one row: eight independent FMA chains. */
static AVX2_TARGET void avx2_quad(const struct gemm_args *a, const uint8_t *panel, Py_ssize_t col0)
{
    avx2_tile(a, panel, 0, NULL, 0, 4, 0, 1, col0);
}

#define AVX2_BLOCKS_CASE(n) case n: avx2_tile(a, panel, 0, NULL, 0, 1, row0, n, col0); break;
#define AVX2_DEQUANTISED_CASE(n) case n: avx2_tile(a, panel, 1, weights, PANEL, 1, row0, n, col0); break;
#define AVX2_FLOATS_CASE(n) case n: avx2_tile_floats(a, weights, ld, row0, n, col0); break;

static AVX2_TARGET void avx2_panel(const struct gemm_args *a, Py_ssize_t p, float *weights)
{
    const uint8_t *panel = a->packed + p * (a->depth / QBLOCK) * BLOCK_BYTES(a->kind);
    const Py_ssize_t col0 = p * PANEL;
    if (a->kind == KIND_F32) {
        weights = (float *)a->packed + (p / 2 * a->depth * 2 + p % 2) * PANEL;
        const Py_ssize_t ld = 2 * PANEL;
        for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX2_FLOAT_ROWS) {
            const int rows = a->rows - row0 < AVX2_FLOAT_ROWS ? (int)(a->rows - row0) : AVX2_FLOAT_ROWS;
            switch (rows) {
                AVX2_FLOATS_CASE(1) AVX2_FLOATS_CASE(2) AVX2_FLOATS_CASE(3)
                AVX2_FLOATS_CASE(4) AVX2_FLOATS_CASE(5) AVX2_FLOATS_CASE(6)
            }
        }
        return;
    }
    if (a->rows <= AVX2_ROWS) weights = NULL; /* few rows (or no scratch): straight from the blocks */
    if (weights) {
        for (Py_ssize_t b = 0; b < a->depth / QBLOCK; b++) {
            const uint8_t *blk = panel + b * BLOCK_BYTES(a->kind);
            /* unrolled: the Q4_1 nibble choice (j % 2) and load offset (j / 2) become constants */
#pragma GCC unroll 32
            for (int j = 0; j < QBLOCK; j++) {
                __m256 w_lo, w_hi;
                avx2_integers(a->kind, blk, j, &w_lo, &w_hi);
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
                AVX2_DEQUANTISED_CASE(1) AVX2_DEQUANTISED_CASE(2) AVX2_DEQUANTISED_CASE(3)
                AVX2_DEQUANTISED_CASE(4) AVX2_DEQUANTISED_CASE(5) AVX2_DEQUANTISED_CASE(6)
            }
        } else {
            switch (rows) { AVX2_BLOCKS_CASE(1) AVX2_BLOCKS_CASE(2) AVX2_BLOCKS_CASE(3) AVX2_BLOCKS_CASE(4) }
        }
    }
}

/* Both panels of pair p (adjacent in memory) straight from their blocks for up to AVX2_WIDE_ROWS
 * rows: four independent FMA chains per row where one panel alone has two, which wait on the FMA
 * latency (the same sums as one panel at a time, in the same order). */
static AVX2_TARGET void avx2_pair(const struct gemm_args *a, Py_ssize_t p)
{
    const uint8_t *panel = a->packed + p * (a->depth / QBLOCK) * BLOCK_BYTES(a->kind);
    if (a->rows == 1)
        avx2_tile(a, panel, 0, NULL, 0, 2, 0, 1, p * PANEL);
    else
        avx2_tile(a, panel, 0, NULL, 0, 2, 0, 2, p * PANEL);
}

/* ----------------------------------------------------------- dispatching */
Py_ssize_t fd_packed_bytes(int kind, Py_ssize_t cols, Py_ssize_t depth)
{
    if (kind == KIND_MIXED) return -1; /* not a function of the shape: fd_packed_valid reads its header */
    if (kind == KIND_F32) return (cols + 2 * PANEL - 1) / (2 * PANEL) * depth * 2 * PANEL * (Py_ssize_t)sizeof(float);
    if (kind == KIND_BF16) return fd_bf16_packed_bytes(cols, depth);
    if (kind == KIND_W8A8) return fd_w8a8_packed_bytes(cols, depth);
    const Py_ssize_t panels = (cols + PANEL - 1) / PANEL;
    if (is_subblock_kind(subblock_layout(kind))) return panels * (depth / GROUP) * group_bytes(subblock_layout(kind));
    return panels * (depth / QBLOCK) * BLOCK_BYTES(kind);
}

/* Panels per task: a pair (the AVX-512 many-rows kernel computes two at once), or four for one
 * row of block weights, whose sums then run as four independent FMA chains (per panel, a block's sum
 * is a chain of 32 dependent FMAs: with two chains one row waited on the FMA latency). */
#define PAIR_PANELS 2
#define QUAD_PANELS 4

struct gemm_job {
    struct gemm_args a;
    Py_ssize_t panels;
    int isa, panels_per_task;
};

/* The first PREFETCH_BLOCKS blocks of panels first..end-1. The kernels prefetch only within a
 * panel, ahead of their reads, so a panel's first blocks would be read from memory when needed.
 * Each task asks for the next task's (SmolLM2 decode, one row: -7% time per token with AVX2
 * kernels, 0 to -3% with AVX-512; 16 rows alike). Asking for a product's first panels before the
 * norm or attention that precedes it measured no gain, and whole next panels in the int8 kernels
 * (one panel per task) were 25-60% slower. */
static void prefetch_panels(const struct gemm_args *a, Py_ssize_t first, Py_ssize_t end)
{
    if (a->kind == KIND_F32) return; /* float panels are laid out in pairs, and stream from the start */
    const Py_ssize_t panels = (a->cols + PANEL - 1) / PANEL;
    const Py_ssize_t block_bytes = BLOCK_BYTES(a->kind), panel_bytes = (a->depth / QBLOCK) * block_bytes;
    for (Py_ssize_t p = first; p < end && p < panels; p++)
        prefetch_block(a->packed + p * panel_bytes, PREFETCH_BLOCKS * block_bytes);
}

static int panels_per_task(const struct gemm_args *a)
{
    return a->rows == 1 && a->kind == KIND_Q4_1 ? QUAD_PANELS : PAIR_PANELS;
}

static void gemm_task(void *ctx, Py_ssize_t task, int slot)
{
    struct gemm_job *job = ctx;
    const struct gemm_args *a = &job->a;
    const Py_ssize_t first = task * job->panels_per_task;
    prefetch_panels(a, first + job->panels_per_task, first + 2 * job->panels_per_task);
    if (job->panels_per_task == QUAD_PANELS && first + QUAD_PANELS <= job->panels) {
        const uint8_t *panel = a->packed + first * (a->depth / QBLOCK) * BLOCK_BYTES(a->kind);
        if (job->isa == ISA_AVX512)
            avx512_quad(a, panel, first * PANEL);
        else
            avx2_quad(a, panel, first * PANEL);
        return;
    }
    float *weights = NULL;
    /* the dequantised panels of many rows; without scratch memory the kernels read the blocks directly */
    const int few_rows = job->isa == ISA_AVX512 ? AVX512_FEW_ROWS : AVX2_ROWS;
    if (a->kind != KIND_F32 && a->rows > few_rows) weights = fd_thread_scratch((size_t)a->depth * 2 * PANEL * sizeof(float));
    const Py_ssize_t end = first + job->panels_per_task < job->panels ? first + job->panels_per_task : job->panels;
    for (Py_ssize_t p = first; p < end; p += PAIR_PANELS) {
        const int count = p + 1 < end ? 2 : 1;
        if (job->isa == ISA_AVX512)
            avx512_panels(a, p, count, weights);
        else if (count == 2 && a->kind != KIND_F32 && a->rows <= AVX2_WIDE_ROWS)
            avx2_pair(a, p);
        else
            for (int i = 0; i < count; i++) avx2_panel(a, p + i, weights);
    }
    (void)slot;
}

/* The sum of each 32 activations of rows first..end-1, in one fixed order (AVX2 code, which the
 * AVX-512 machines run too), so every kernel folds the same value into the Q4_1 minimums' term. */
static AVX2_TARGET void block_sums_rows(const float *x, Py_ssize_t first, Py_ssize_t end, Py_ssize_t depth,
                                        float *sums)
{
    const Py_ssize_t blocks = depth / QBLOCK;
    for (Py_ssize_t r = first; r < end; r++)
        for (Py_ssize_t b = 0; b < blocks; b++) {
            const float *v = x + r * depth + b * QBLOCK;
            const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(v), _mm256_loadu_ps(v + 8)),
                                           _mm256_add_ps(_mm256_loadu_ps(v + 16), _mm256_loadu_ps(v + 24)));
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            sums[r * blocks + b] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
        }
}

#define BLOCK_SUM_ROWS_PER_TASK 16
#define BLOCK_SUMS_ON_STACK 1024 /* floats: up to 21 rows of the deepest SmolLM2 product */

static void block_sums_task(void *ctx, Py_ssize_t index, int slot)
{
    const struct gemm_args *a = ctx;
    const Py_ssize_t first = index * BLOCK_SUM_ROWS_PER_TASK;
    const Py_ssize_t end = first + BLOCK_SUM_ROWS_PER_TASK < a->rows ? first + BLOCK_SUM_ROWS_PER_TASK : a->rows;
    block_sums_rows(a->x, first, end, a->depth, (float *)a->block_sums);
    (void)slot;
}

int fd_gemm(const struct gemm_args *a, int isa, int threads)
{
    if (a->rows <= 0) return 0;
    if (a->kind == KIND_Q4_1_I8 || a->kind == KIND_Q8_0_I8) return gemm_int8(a, isa, threads);
    if (is_subblock_kind(a->kind)) return gemm_blocks(a, isa, threads);
    if (is_int8_subblock_kind(a->kind)) return gemm_blocks_int8(a, isa, threads);
    if (a->kind == KIND_MIXED) return gemm_mixed(a, isa, threads);
    if (a->kind == KIND_BF16) return fd_gemm_bf16(a, isa, threads);
    if (a->kind == KIND_W8A8) return fd_gemm_w8a8(a, isa, threads);
    const Py_ssize_t panels = (a->cols + PANEL - 1) / PANEL;
    struct gemm_job job = {*a, panels, isa, panels_per_task(a)};
    float on_stack[BLOCK_SUMS_ON_STACK], *sums = NULL;
    if (a->kind == KIND_Q4_1) {
        const Py_ssize_t count = a->rows * (a->depth / QBLOCK);
        sums = count <= BLOCK_SUMS_ON_STACK ? on_stack : PyMem_RawMalloc((size_t)count * sizeof(float));
        if (sums == NULL) return -1;
        job.a.block_sums = sums;
        if (a->rows <= BLOCK_SUM_ROWS_PER_TASK)
            block_sums_rows(a->x, 0, a->rows, a->depth, sums);
        else
            fd_parallel_for((a->rows + BLOCK_SUM_ROWS_PER_TASK - 1) / BLOCK_SUM_ROWS_PER_TASK, threads,
                            block_sums_task, &job.a);
    }
    fd_parallel_for((panels + job.panels_per_task - 1) / job.panels_per_task, threads, gemm_task, &job);
    if (sums != on_stack) PyMem_RawFree(sums);
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
    } else if (kind < KIND_Q4_1 || kind >= KINDS) {
        PyErr_Format(PyExc_ValueError, "unknown weight kind %d", kind);
    } else if (rows < 0 || cols <= 0 || depth <= 0 || (kind != KIND_F32 && kind != KIND_BF16 && depth % QBLOCK != 0)) {
        PyErr_Format(PyExc_ValueError,
                     "bad shape rows=%zd cols=%zd depth=%zd (quantised depth must be a multiple of %d)", rows, cols,
                     depth, QBLOCK);
    } else if (x.len != rows * depth * (Py_ssize_t)sizeof(float) ||
               out.len != rows * cols * (Py_ssize_t)sizeof(float) ||
               !fd_packed_valid(kind, packed.buf, packed.len, cols, depth)) {
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
