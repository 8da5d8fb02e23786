/*
 * Products on sub-block panels (blocks.h), written once over a 16-float vector `v16` and compiled
 * once per instruction set: gemm_blocks_avx512.c (one zmm register) and gemm_blocks_avx2.c (two
 * ymm registers) set the target and define, before including this file:
 *   VEC_AVX512     1 for AVX-512, 0 for AVX2
 *   BLOCKS_TASK    the name of the entry point to define (gemm_blocks.c calls it per task)
 *   FEW_ROWS       up to this many rows read the blocks directly; more go through a float buffer
 *   WIDE_ROWS      rows per tile straight from the blocks (2 or 4), through both panels of a pair
 *   BUF_ROWS, BUF_WIDTH   rows and panels per tile over the float buffer
 *   ROW_TILE       1: one row's four panels through row_tile (totals in memory), 0: through tile
 *
 * Arithmetic, identical in every kernel shape and both instruction sets (so a row's result does not
 * depend on how many rows share the call, nor on the ISA; tests check each row count bit for bit
 * against the many-rows path): per row, column and sub-block, s = x.q as one chain of FMAs along
 * k in order, from 0; then total = fma(scale, s, total) and, with a minimum, total = fma(minimum,
 * xsum, total), sub-block after sub-block from total = 0; xsum, the sub-block's sum of x, comes from
 * gemm_blocks.c (one order for all). A group's integers are decoded whole into 512 int8 in L1
 * (block_quants.h: full-width operations on nibbles and planes), then widened to floats 16 at a time
 * (one k of the panel's 16 columns) where they are used (few rows: each weight is read once), or once
 * per task into a float buffer that every row tile reuses (many rows). One row takes four panels at
 * once (four to eight independent FMA chains), few rows the pair's two panels. AVX2's 16 ymm
 * registers cannot hold one row's 8 sums, 8 totals and the widened weights of tile(): GCC kept the
 * sums on the stack, a store and a reload in every FMA chain. row_tile keeps the totals (changed
 * once per sub-block) in memory instead, and reads each 8 weights with three vector operations
 * (vpmovsxbd from memory, vcvtdq2ps, vfmadd): the AVX2 one-row product 1.14-1.19x faster on
 * ERNIE-shaped layers (one thread). AVX-512 has the registers (the totals' memory cost it 1%), so
 * it keeps tile(). The buffered tiles are compiled per sub-block size and minimum,
 * the others per kind: fewer row-count cases than gemm.c keep the build of ten kinds short.
 * Not a header to include anywhere else.
 */
#include "block_quants.h"

#include <immintrin.h>
#include <string.h>

#define PREFETCH_GROUPS 2 /* as gemm.c's PREFETCH_BLOCKS */
#define MAX_WIDTH 4
#define MAX_TILE 12 /* rows x panels of any tile */

#define INLINE static inline __attribute__((always_inline))

#if VEC_AVX512
typedef __m512 v16;
INLINE v16 v_zero(void) { return _mm512_setzero_ps(); }
INLINE v16 v_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
INLINE v16 v_broadcast(const float *p) { return _mm512_set1_ps(*p); }
INLINE v16 v_load(const void *p) { return _mm512_loadu_ps(p); }
INLINE void v_store(float *p, v16 v) { _mm512_storeu_ps(p, v); }
/* 16 int8 at p as floats */
INLINE v16 v_from_i8(const int8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
#else
typedef struct {
    __m256 lo, hi;
} v16;
INLINE v16 v_zero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
INLINE v16 v_fma(v16 a, v16 b, v16 c) { return (v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
INLINE v16 v_broadcast(const float *p)
{
    const __m256 v = _mm256_broadcast_ss(p);
    return (v16){v, v};
}
INLINE v16 v_load(const void *p) { return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps((const float *)p + 8)}; }
INLINE void v_store(float *p, v16 v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
/* two 8-byte loads, each widened by vpmovsxbd from memory: one 16-byte load and a shuffle for its
 * upper half cost a third vector operation per 16 weights (the one-row product, in row_tile, 1.15x
 * slower with it, two to three rows the same) */
INLINE v16 v_from_i8(const int8_t *p)
{
    return (v16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))),
                 _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))))};
}
#endif

INLINE void prefetch_bytes(const uint8_t *p, Py_ssize_t bytes)
{
    for (Py_ssize_t line = 0; line < bytes; line += 64) _mm_prefetch((const char *)p + line, _MM_HINT_T0);
}

/* Stores the tile's totals (total[r * width + i]: row r, panel i at column col0 + 16 i) plus bias. */
INLINE void store(const struct gemm_args *a, const v16 *total, Py_ssize_t row0, int rows, Py_ssize_t col0, int width)
{
    for (int i = 0; i < width; i++) {
        const Py_ssize_t start = col0 + i * PANEL, valid = a->cols - start < PANEL ? a->cols - start : PANEL;
        for (int r = 0; r < rows; r++) {
            float t[PANEL];
            v_store(t, total[r * width + i]);
            float *dst = a->out + (row0 + r) * a->cols + start;
            if (a->bias)
                for (Py_ssize_t n = 0; n < valid; n++) dst[n] = t[n] + a->bias[start + n];
            else
                memcpy(dst, t, (size_t)valid * sizeof(float));
        }
    }
}

/* `width` adjacent panels (the first at `panel`, panel_bytes apart; groups of gbytes) for `rows` rows
 * from row0; the integers and factors decoded from the groups, or when `buf` is given from the float
 * buffer (row k at buf + k * ld, panel i at + 16 i) and `facs` (panel i, group g at + (i groups + g)
 * GROUP_FACTORS): the buffered tiles depend on the kind only through its sub-block size and minimum,
 * so they are compiled once per such pair (fold_kind), not per kind. */
INLINE void tile(const struct gemm_args *a, const float *xsums, int kind, Py_ssize_t gbytes, const uint8_t *panel,
                 Py_ssize_t panel_bytes, const float *buf, const float *facs, Py_ssize_t ld, int width, Py_ssize_t row0,
                 int rows, Py_ssize_t col0)
{
    const int sub = block_sub(kind), subs = GROUP / sub, with_min = block_has_min(kind);
    const Py_ssize_t depth = a->depth, groups = depth / GROUP, nsub = depth / sub;
    const float *x = a->x + row0 * depth;
    v16 total[MAX_TILE];
    _Alignas(64) int8_t scratch[MAX_WIDTH][GROUP_INTS]; /* the groups' integers, decoded (few rows) */
    const int8_t *ints[MAX_WIDTH];
    _Alignas(64) float fac[MAX_WIDTH][GROUP_FACTORS]; /* and their factors */
#pragma GCC unroll 12
    for (int i = 0; i < rows * width; i++) total[i] = v_zero();
    for (Py_ssize_t g = 0; g < groups; g++) {
        const float *f[MAX_WIDTH];
#pragma GCC unroll 4
        for (int i = 0; i < width; i++) {
            if (buf) {
                f[i] = facs + (i * groups + g) * GROUP_FACTORS;
                continue;
            }
            const uint8_t *grp = panel + i * panel_bytes + g * gbytes;
            prefetch_bytes(grp + PREFETCH_GROUPS * gbytes, gbytes);
            ints[i] = group_ints(kind, grp, scratch[i]);
            group_factors(kind, grp, fac[i]);
            f[i] = fac[i];
        }
        const float *xg = x + g * GROUP;
#pragma GCC unroll 1
        for (int s = 0; s < subs; s++) {
            v16 sum[MAX_TILE];
#pragma GCC unroll 12
            for (int i = 0; i < rows * width; i++) sum[i] = v_zero();
            /* unrolled by 8 only (short builds): the nibble half of k is a constant */
#pragma GCC unroll 1
            for (int k8 = s * sub; k8 < (s + 1) * sub; k8 += 8)
#pragma GCC unroll 8
            for (int kk = 0; kk < 8; kk++) {
                const int k = k8 + kk;
                v16 w[MAX_WIDTH];
#pragma GCC unroll 4
                for (int i = 0; i < width; i++)
                    w[i] = buf ? v_load(buf + (g * GROUP + k) * ld + i * PANEL) : v_from_i8(ints[i] + PANEL * k);
#pragma GCC unroll 8
                for (int r = 0; r < rows; r++) {
                    const v16 xv = v_broadcast(xg + r * depth + k);
#pragma GCC unroll 4
                    for (int i = 0; i < width; i++) sum[r * width + i] = v_fma(xv, w[i], sum[r * width + i]);
                }
            }
#pragma GCC unroll 4
            for (int i = 0; i < width; i++) {
                const v16 scale = v_load(f[i] + s * PANEL);
                const v16 minimum = with_min ? v_load(f[i] + (subs + s) * PANEL) : scale;
#pragma GCC unroll 8
                for (int r = 0; r < rows; r++) {
                    v16 t = v_fma(scale, sum[r * width + i], total[r * width + i]);
                    if (with_min) t = v_fma(minimum, v_broadcast(xsums + (row0 + r) * nsub + g * subs + s), t);
                    total[r * width + i] = t;
                }
            }
        }
    }
    store(a, total, row0, rows, col0, width);
}

/* One row, `width` adjacent panels straight from the blocks: tile()'s arithmetic in the same order,
 * with the totals kept in memory (they change once per sub-block) so that the 2 x width sums (AVX2:
 * ymm pairs) stay in registers. */
INLINE void row_tile(const struct gemm_args *a, const float *xsums, int kind, Py_ssize_t gbytes, const uint8_t *panel,
                     Py_ssize_t panel_bytes, int width, Py_ssize_t col0)
{
    const int sub = block_sub(kind), subs = GROUP / sub, with_min = block_has_min(kind);
    const Py_ssize_t depth = a->depth, groups = depth / GROUP;
    const float *x = a->x;
    _Alignas(64) float totals[MAX_WIDTH][PANEL] = {{0}};
    _Alignas(64) int8_t scratch[MAX_WIDTH][GROUP_INTS];
    const int8_t *ints[MAX_WIDTH];
    _Alignas(64) float fac[MAX_WIDTH][GROUP_FACTORS];
    for (Py_ssize_t g = 0; g < groups; g++) {
#pragma GCC unroll 4
        for (int i = 0; i < width; i++) {
            const uint8_t *grp = panel + i * panel_bytes + g * gbytes;
            prefetch_bytes(grp + PREFETCH_GROUPS * gbytes, gbytes);
            ints[i] = group_ints(kind, grp, scratch[i]);
            group_factors(kind, grp, fac[i]);
        }
        const float *xg = x + g * GROUP;
#pragma GCC unroll 1
        for (int s = 0; s < subs; s++) {
            v16 sum[MAX_WIDTH];
#pragma GCC unroll 4
            for (int i = 0; i < width; i++) sum[i] = v_zero();
#pragma GCC unroll 1
            for (int k8 = s * sub; k8 < (s + 1) * sub; k8 += 8)
#pragma GCC unroll 8
            for (int kk = 0; kk < 8; kk++) {
                const int k = k8 + kk;
                const v16 xv = v_broadcast(xg + k);
#pragma GCC unroll 4
                for (int i = 0; i < width; i++) sum[i] = v_fma(xv, v_from_i8(ints[i] + PANEL * k), sum[i]);
            }
#pragma GCC unroll 4
            for (int i = 0; i < width; i++) {
                v16 t = v_fma(v_load(fac[i] + s * PANEL), sum[i], v_load(totals[i]));
                if (with_min) t = v_fma(v_load(fac[i] + (subs + s) * PANEL), v_broadcast(xsums + g * subs + s), t);
                v_store(totals[i], t);
            }
        }
    }
    v16 total[MAX_WIDTH];
#pragma GCC unroll 4
    for (int i = 0; i < width; i++) total[i] = v_load(totals[i]);
    store(a, total, 0, 1, col0, width);
}

/* a kind with `kind`'s sub-block size and minimum (what the buffered tiles depend on) */
INLINE int fold_kind(int kind)
{
    return block_sub(kind) == 32 ? (block_has_min(kind) ? KIND_Q4_K : KIND_Q4_0)
                                 : (block_has_min(kind) ? KIND_Q2_K : KIND_Q6_K);
}

#define CASES_2(CASE) CASE(1) CASE(2)
#define CASES_4(CASE) CASES_2(CASE) CASE(3) CASE(4)
#define CASES_6(CASE) CASES_4(CASE) CASE(5) CASE(6)
#if WIDE_ROWS == 4
#define CASES_WIDE CASES_4
#else
#define CASES_WIDE CASES_2
#endif

/* Panels p .. p + count - 1 (count 1 or 2) for all rows; `weights`, when given, a float scratch buffer
 * for the many-rows path: depth x 32 integers, then the factors of both panels' groups. */
INLINE void panels_kind(const struct gemm_args *a, const float *xsums, int kind, Py_ssize_t p, int count,
                        float *weights)
{
    const Py_ssize_t gbytes = group_bytes(kind), panel_bytes = a->depth / GROUP * gbytes;
    const uint8_t *panel = a->packed + p * panel_bytes;
    const Py_ssize_t col0 = p * PANEL;
    if (weights == NULL) { /* few rows (or no scratch memory): straight from the blocks, rows in tiles */
        for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += WIDE_ROWS) {
            const Py_ssize_t left = a->rows - row0;
            if (count == 2) {
#define WIDE_CASE(n) case n: tile(a, xsums, kind, gbytes, panel, panel_bytes, NULL, NULL, 0, 2, row0, n, col0); break;
                switch (left < WIDE_ROWS ? (int)left : WIDE_ROWS) { CASES_WIDE(WIDE_CASE) }
#undef WIDE_CASE
            } else {
#define ONE_CASE(n) case n: tile(a, xsums, kind, gbytes, panel, panel_bytes, NULL, NULL, 0, 1, row0, n, col0); break;
                switch (left < WIDE_ROWS ? (int)left : WIDE_ROWS) { CASES_WIDE(ONE_CASE) }
#undef ONE_CASE
            }
        }
        return;
    }
    const Py_ssize_t ld = count * PANEL, groups = a->depth / GROUP;
    const int fold = fold_kind(kind);
    float *facs = weights + a->depth * 2 * PANEL; /* [panel][group][GROUP_FACTORS] */
    for (int i = 0; i < count; i++)
        for (Py_ssize_t g = 0; g < groups; g++) {
            _Alignas(64) int8_t scratch[GROUP_INTS];
            const int8_t *ints = group_ints(kind, panel + i * panel_bytes + g * gbytes, scratch);
            group_factors(kind, panel + i * panel_bytes + g * gbytes, facs + (i * groups + g) * GROUP_FACTORS);
#pragma GCC unroll 1
            for (int k8 = 0; k8 < GROUP; k8 += 8)
#pragma GCC unroll 8
                for (int kk = 0; kk < 8; kk++)
                    v_store(weights + (g * GROUP + k8 + kk) * ld + i * PANEL, v_from_i8(ints + PANEL * (k8 + kk)));
        }
    for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += BUF_ROWS) {
        const int rows = a->rows - row0 < BUF_ROWS ? (int)(a->rows - row0) : BUF_ROWS;
        if (BUF_WIDTH == 2 && count == 2) {
#define PAIR_CASE(n) case n: tile(a, xsums, fold, gbytes, panel, panel_bytes, weights, facs, ld, 2, row0, n, col0); break;
            switch (rows) { CASES_6(PAIR_CASE) }
#undef PAIR_CASE
        } else {
            for (int i = 0; i < count; i++) {
#define ONE_CASE(n) case n: tile(a, xsums, fold, gbytes, panel + i * panel_bytes, panel_bytes, weights + i * PANEL, facs + i * groups * GROUP_FACTORS, ld, 1, row0, n, col0 + i * PANEL); break;
                switch (rows) { CASES_6(ONE_CASE) }
#undef ONE_CASE
            }
        }
    }
}

/* Panels first .. end - 1 of the product: four at once for one row, else pairs. */
INLINE void task_kind(const struct gemm_args *a, const float *xsums, int kind, Py_ssize_t first, Py_ssize_t end)
{
    const Py_ssize_t panel_bytes = a->depth / GROUP * group_bytes(kind);
    if (a->rows == 1 && end - first == 4) {
        if (ROW_TILE)
            row_tile(a, xsums, kind, group_bytes(kind), a->packed + first * panel_bytes, panel_bytes, 4, first * PANEL);
        else
            tile(a, xsums, kind, group_bytes(kind), a->packed + first * panel_bytes, panel_bytes, NULL, NULL, 0, 4, 0, 1,
                 first * PANEL);
        return;
    }
    /* without scratch memory the kernels read the blocks directly */
    const size_t floats = (size_t)a->depth * 2 * PANEL + (size_t)(a->depth / GROUP) * 2 * GROUP_FACTORS;
    float *weights = a->rows > FEW_ROWS ? fd_thread_scratch(floats * sizeof(float)) : NULL;
    for (Py_ssize_t p = first; p < end; p += 2) panels_kind(a, xsums, kind, p, p + 1 < end ? 2 : 1, weights);
}

void BLOCKS_TASK(const struct gemm_args *a, const float *xsums, Py_ssize_t first, Py_ssize_t end)
{
    switch (a->kind) {
#define KIND_CASE(k) case k: task_kind(a, xsums, k, first, end); break;
        KIND_CASE(KIND_Q4_0) KIND_CASE(KIND_Q5_0) KIND_CASE(KIND_Q5_1) KIND_CASE(KIND_Q2_K) KIND_CASE(KIND_Q3_K)
        KIND_CASE(KIND_Q4_K) KIND_CASE(KIND_Q5_K) KIND_CASE(KIND_Q6_K) KIND_CASE(KIND_IQ4_NL) KIND_CASE(KIND_IQ4_XS)
        KIND_CASE(KIND_MXFP4)
#undef KIND_CASE
    }
}
