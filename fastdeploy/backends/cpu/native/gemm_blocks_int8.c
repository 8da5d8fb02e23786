/*
 * Products of the sub-block kinds (blocks.h: Q4_0 .. IQ4_XS) with int8 activations, as llama.cpp
 * computes its quantised matmuls: the KIND_*_I8 twins of those kinds (opt-in,
 * FD_CPU_ACTIVATIONS=int8), on the very panels the float32 kernels read (block_packing.c), for
 * every row count (up to FEW_ROWS in gemm_blocks_int8_rows.c); and,
 * from FEW_ROWS + 1 rows, the products of KIND_Q8_0_I8 and KIND_Q4_1_I8 (packing.c's int8 layouts:
 * blocks of 32 without sub-blocks, Q8_0 signed without minimum, Q4_1 unsigned 0..15 with one) on
 * the same tiles (their fewer rows stay in gemm_int8.c, whose float operations are these).
 *
 * Why: the float32 kernels widen every weight to float32 and spend one FMA per weight and row.
 * With the activations in int8 too, one AVX-512 VNNI `vpdpbusd` multiplies and sums 64
 * weight-activation pairs, its AVX-VNNI form 32 (the AVX2 kernels, on CPUs with AVX-VNNI), and
 * plain AVX2 32 per `vpmaddubsw`, whose int16 pair sums add up over a sub-block (4-bit weights) or
 * half of one (5- and 6-bit) before one `vpmaddwd` and `vpaddd` (avx2_tile).
 *
 * Activations (quantize_rows here, the bits of gemm_int8.c's fd_quantize_rows eight values per
 * instruction): per row and 32-value block (one panel group), sx = max|x| / 127, qx = round(x / sx)
 * in -127..127; and each sub-block's sum of qx. Per row, column, group and sub-block s (16 or 32 k)
 * with the weights' integers qw (blocks.h: after offset or codebook), effective scale d_s and
 * minimum m_s, the integer dot D_s = sum qw qx is exact; then
 *     part = sum over s, in order, of fma(d_s, D_s, .) and (with a minimum) fma(m_s, sum_s qx, .)
 *     out += sx * part    (one FMA per group, groups in order)
 * Every instruction set performs these float operations in this order on the same exact integers,
 * so they agree bit for bit, and a row's result does not depend on the rows beside it.
 *
 * The panels hold or decode to one k per 16 bytes (16 columns: group_ints); the dot instructions take 4
 * consecutive k of a column per 32-bit lane. Each task (two adjacent panels) therefore regroups its
 * integers once into [depth / 4][16 columns][4 k] bytes, plus an offset that makes them unsigned
 * (128 for vpdpbusd, the type's own for maddubs: weight_offset) and the dots start from -offset sum qx,
 * with the groups' scales beside them, which every row tile then reads: 6 rows times 32 columns
 * for AVX-512 (24 zmm accumulators: a dot and a total per row and panel; 4 rows for sub-blocks of
 * 16, whose part sums also stay live), 2 rows times 16 columns for AVX2 (the totals in L1). The tiles are compiled once per sub-block size and minimum (and, for
 * maddubs, how many k-steps add up in int16), their dot loops unrolled; rows are padded to whole
 * tiles. Regrouping once at load instead would double a 4-bit weight's memory for a cost that is
 * paid per product, not per row (measured: about 4% of a 512-row Q4_K product); up to FEW_ROWS rows,
 * which cannot amortise it, read the panels straight and decode each group in registers into the
 * dots' order (gemm_blocks_int8_rows.c), with the arithmetic above: the same bits per row.
 */
#pragma GCC target("avx2,fma,f16c") /* what isa.c checks for ISA_AVX2; the VNNI code adds its own */
#include "blocks_int8.h"

#include "block_quants.h"

#include <string.h>

#define PAD_ROWS 12     /* the activations are padded to a multiple of every tile's rows */
#define MAX_VNNI_ROWS 6 /* rows of a VNNI tile: 6 for sub-blocks of 32, 4 for 16 (their part sums stay live) */
#define AVX2_ROWS 2     /* rows of an AVX2 tile (4 took 5-25% more time at depth 1024: L1) */
#define QUANTIZE_ROWS_PER_TASK 16
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* Two adjacent panels regrouped for the dot instructions (the second all zero past the matrix):
 * w: [panel][depth / 4][16 columns][4 k] bytes, +128 for vpdpbusd's unsigned operand;
 * factors: [group][panel][the group's scales, then minimums] float32 (block_quants.h: group_factors). */
struct panel_pair {
    const uint8_t *w;
    const float *factors;
};

/* One panel's integers regrouped (4 consecutive k of each column side by side), `offset` added, and
 * its groups' float32 factors (group g at f + (g * 2 + p) * factors: panel p of the pair); compiled
 * per kind (int8_weights), so group_ints and group_factors do not branch on it. */
INLINE void regroup(int kind, const uint8_t *panel, Py_ssize_t groups, int offset, uint8_t *w, float *f,
                    Py_ssize_t factors, int p)
{
    const Py_ssize_t gbytes = group_bytes(kind);
    const __m128i bias = _mm_set1_epi8((char)offset);
    _Alignas(64) int8_t scratch[GROUP_INTS];
    for (Py_ssize_t g = 0; g < groups; g++) {
        const int8_t *ints = group_ints(kind, panel + g * gbytes, scratch);
        group_factors(kind, panel + g * gbytes, f + (g * 2 + p) * factors);
        for (int k = 0; k < GROUP; k += 4) {
            const __m128i *row = (const __m128i *)(ints + PANEL * k);
            const __m128i k0 = _mm_loadu_si128(row), k1 = _mm_loadu_si128(row + 1);
            const __m128i k2 = _mm_loadu_si128(row + 2), k3 = _mm_loadu_si128(row + 3);
            const __m128i lo01 = _mm_unpacklo_epi8(k0, k1), hi01 = _mm_unpackhi_epi8(k0, k1);
            const __m128i lo23 = _mm_unpacklo_epi8(k2, k3), hi23 = _mm_unpackhi_epi8(k2, k3);
            __m128i *dst = (__m128i *)(w + (g * GROUP + k) * PANEL);
            _mm_storeu_si128(dst, _mm_add_epi8(_mm_unpacklo_epi16(lo01, lo23), bias));     /* columns 0-3 */
            _mm_storeu_si128(dst + 1, _mm_add_epi8(_mm_unpackhi_epi16(lo01, lo23), bias)); /* 4-7 */
            _mm_storeu_si128(dst + 2, _mm_add_epi8(_mm_unpacklo_epi16(hi01, hi23), bias)); /* 8-11 */
            _mm_storeu_si128(dst + 3, _mm_add_epi8(_mm_unpackhi_epi16(hi01, hi23), bias)); /* 12-15 */
        }
    }
}

static void int8_weights(int kind, const uint8_t *panel, Py_ssize_t groups, int offset, uint8_t *w, float *f,
                         Py_ssize_t factors, int p)
{
    switch (kind) {
#define REGROUP_CASE(k)                                                                                               \
    case k: regroup(k, panel, groups, offset, w, f, factors, p); break;
        REGROUP_CASE(KIND_Q4_0) REGROUP_CASE(KIND_Q5_0) REGROUP_CASE(KIND_Q5_1) REGROUP_CASE(KIND_Q2_K)
        REGROUP_CASE(KIND_Q3_K) REGROUP_CASE(KIND_Q4_K) REGROUP_CASE(KIND_Q5_K) REGROUP_CASE(KIND_Q6_K_NIBBLES)
        REGROUP_CASE(KIND_IQ4_NL) REGROUP_CASE(KIND_IQ4_XS)
#undef REGROUP_CASE
    }
}

/* Rows [first, end) of x quantised as fd_quantize_rows does (the same bits: one IEEE division,
 * product and round-to-nearest-even per value), eight values per instruction, with the per-sub-block
 * sums this file's kernels start from. */
static void quantize_rows(const float *x, Py_ssize_t first, Py_ssize_t end, Py_ssize_t depth, int sub, int offset,
                          int8_t *q, float *scale, int32_t *init, float *sum)
{
    const Py_ssize_t blocks = depth / GROUP, subs = depth / sub;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i top = _mm256_set1_epi32(127), bottom = _mm256_set1_epi32(-127);
    for (Py_ssize_t r = first; r < end; r++)
        for (Py_ssize_t b = 0; b < blocks; b++) {
            const float *xb = x + r * depth + b * GROUP;
            __m256 v[4], peak8 = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                peak8 = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), peak8); /* NaN ignored, as fmaxf */
            }
            __m128 peak4 = _mm_max_ps(_mm256_castps256_ps128(peak8), _mm256_extractf128_ps(peak8, 1));
            peak4 = _mm_max_ps(peak4, _mm_movehl_ps(peak4, peak4));
            const float peak = _mm_cvtss_f32(_mm_max_ss(peak4, _mm_shuffle_ps(peak4, peak4, 1)));
            const __m256 inverse = _mm256_set1_ps(peak > 0.0f ? 127.0f / peak : 0.0f);
            __m256i qi[4];
            for (int i = 0; i < 4; i++)
                qi[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse)), top), bottom);
            const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
            /* the packs interleave 128-bit lanes: k 0-3 8-11 16-19 24-27 | 4-7 12-15 20-23 28-31 */
            _mm256_storeu_si256((__m256i *)(q + r * depth + b * GROUP),
                                _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            scale[r * blocks + b] = peak / 127.0f;
            int32_t halves[2];
            for (int h = 0; h < 2; h++) {
                const __m256i s8 = _mm256_add_epi32(qi[2 * h], qi[2 * h + 1]);
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
                halves[h] = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
            }
            for (int h = 0; h < GROUP / sub; h++) {
                const int32_t total = sub == 16 ? halves[h] : halves[0] + halves[1];
                init[r * subs + b * (GROUP / sub) + h] = -offset * total;
                sum[r * subs + b * (GROUP / sub) + h] = (float)total;
            }
        }
}

/* packing.c's int8 layouts, whose blocks already hold 4 consecutive k of a column side by side */
static inline int legacy_kind(int kind) { return kind == KIND_Q8_0_I8 || kind == KIND_Q4_1_I8; }
static inline int kind_has_min(int kind) { return block_has_min(kind) || kind == KIND_Q4_1_I8; }
/* whether the AVX2 maddubs dots must take signed weights (|x| times w with x's sign) */
static inline int kind_signed(int kind) { return block_codebook(kind) || kind == KIND_Q8_0_I8; }
static inline Py_ssize_t legacy_block_bytes(int kind) { return kind == KIND_Q8_0_I8 ? PANEL * 2 + PANEL * GROUP : PANEL * 4 + PANEL * GROUP / 2; }

/* One panel of a legacy kind as int8_weights leaves the others (its Q8_0 bytes carry +128, packing.c),
 * and its float16 scales (and minimums) as float32 factors of panel p of the pair. */
static void legacy_weights(int kind, const uint8_t *panel, Py_ssize_t groups, int offset, uint8_t *w, float *f,
                           Py_ssize_t factors, int p)
{
    const __m256i low = _mm256_set1_epi8(0x0F), bias = _mm256_set1_epi8((char)offset);
    const __m256i shift = _mm256_set1_epi8((char)(offset - 128));
    for (Py_ssize_t g = 0; g < groups; g++) {
        const uint8_t *blk = panel + g * legacy_block_bytes(kind);
        uint8_t *wg = w + g * GROUP * PANEL;
        float *fg = f + (g * 2 + p) * factors;
        for (int i = 0; i < factors; i += 8) _mm256_storeu_ps(fg + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 2 * i))));
        if (kind == KIND_Q8_0_I8) {
            for (int i = 0; i < GROUP * PANEL; i += 32) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 2 * PANEL + i));
                _mm256_storeu_si256((__m256i *)(wg + i), _mm256_add_epi8(v, shift));
            }
            continue;
        }
        /* chunk c: low nibbles k = 8c .. 8c + 3, high ones the next 4 */
        for (int c = 0; c < 4; c++)
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 4 * PANEL + 64 * c + 32 * h));
                _mm256_storeu_si256((__m256i *)(wg + 128 * c + 32 * h), _mm256_add_epi8(_mm256_and_si256(v, low), bias));
                _mm256_storeu_si256((__m256i *)(wg + 128 * c + 64 + 32 * h),
                                    _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), bias));
            }
    }
}

/* ------------------------------------------------------------- AVX-512 VNNI */
/* R rows from row0 times both panels of a pair: each activation broadcast and sub-block
 * sum serves both panels, and every sub-block's dot loop is unrolled (sub and with_min constant). */
INLINE VNNI_TARGET void vnni_tile(const struct gemm_args *a, const struct int8_acts *x, const struct panel_pair *pp,
                                  int sub, int with_min, int R, Py_ssize_t row0, Py_ssize_t col0)
{
    const Py_ssize_t depth = a->depth, groups = depth / GROUP, subs_row = depth / sub;
    const int subs = GROUP / sub, factors = subs * PANEL * (1 + with_min);
    const int8_t *q = x->q + row0 * depth;
    const uint8_t *w1 = pp->w + depth * PANEL;
    __m512 total[MAX_VNNI_ROWS * 2];
    for (int i = 0; i < MAX_VNNI_ROWS * 2; i++) total[i] = _mm512_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g++) {
        __m512 part[MAX_VNNI_ROWS * 2];
        for (int s = 0; s < subs; s++) {
            const Py_ssize_t k0 = g * GROUP + s * sub, at = g * subs + s;
            __m512i dot[MAX_VNNI_ROWS * 2];
            for (int r = 0; r < R; r++) dot[2 * r] = dot[2 * r + 1] = _mm512_set1_epi32(x->init[(row0 + r) * subs_row + at]);
#pragma GCC unroll 8
            for (int k = 0; k < sub; k += 4) {
                const __m512i wa = _mm512_loadu_si512(pp->w + (k0 + k) * PANEL), wb = _mm512_loadu_si512(w1 + (k0 + k) * PANEL);
                for (int r = 0; r < R; r++) {
                    const __m512i xv = _mm512_set1_epi32(four_bytes(q + r * depth + k0 + k));
                    dot[2 * r] = _mm512_dpbusd_epi32(dot[2 * r], wa, xv);
                    dot[2 * r + 1] = _mm512_dpbusd_epi32(dot[2 * r + 1], wb, xv);
                }
            }
            for (int p = 0; p < 2; p++) {
                const float *f = pp->factors + (g * 2 + p) * factors;
                const __m512 scale = _mm512_loadu_ps(f + s * PANEL);
                for (int r = 0; r < R; r++) {
                    const __m512 before = s == 0 ? _mm512_setzero_ps() : part[2 * r + p];
                    __m512 t = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot[2 * r + p]), before);
                    if (with_min)
                        t = _mm512_fmadd_ps(_mm512_loadu_ps(f + (subs + s) * PANEL),
                                            _mm512_set1_ps(x->sum[(row0 + r) * subs_row + at]), t);
                    part[2 * r + p] = t;
                }
            }
        }
        for (int r = 0; r < R; r++) {
            const __m512 sx = _mm512_set1_ps(x->scale[(row0 + r) * groups + g]);
            total[2 * r] = _mm512_fmadd_ps(part[2 * r], sx, total[2 * r]);
            total[2 * r + 1] = _mm512_fmadd_ps(part[2 * r + 1], sx, total[2 * r + 1]);
        }
    }
    const Py_ssize_t rows = a->rows - row0 < R ? a->rows - row0 : R;
    for (int p = 0; p < 2; p++) {
        const Py_ssize_t start = col0 + p * PANEL, valid = a->cols - start < PANEL ? a->cols - start : PANEL;
        if (valid <= 0) break;
        const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
        const __m512 bias = a->bias ? _mm512_maskz_loadu_ps(mask, a->bias + start) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++) {
            const __m512 t = total[2 * r + p];
            _mm512_mask_storeu_ps(a->out + (row0 + r) * a->cols + start, mask, a->bias ? _mm512_add_ps(t, bias) : t);
        }
    }
}

#define VNNI_ROWS_FN(name, sub, with_min, tile_rows)                                                                  \
    static VNNI_TARGET void name(const struct gemm_args *a, const struct int8_acts *x, const struct panel_pair *pp, \
                                 Py_ssize_t col0)                                                                   \
    {                                                                                                               \
        for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += tile_rows) vnni_tile(a, x, pp, sub, with_min, tile_rows, row0, col0); \
    }
VNNI_ROWS_FN(vnni_rows_32, 32, 0, 6)
VNNI_ROWS_FN(vnni_rows_32_min, 32, 1, 6)
VNNI_ROWS_FN(vnni_rows_16, 16, 0, 4)
VNNI_ROWS_FN(vnni_rows_16_min, 16, 1, 4)
#undef VNNI_ROWS_FN

/* ------------------------------------------------------------------- AVX2 */
/* How the AVX2 tiles multiply (and the weight offset the regrouping adds): AVX-VNNI's `vpdpbusd`
 * (weights + 128, unsigned); else `vpmaddubsw` on weights made non-negative by their type's offset
 * (at most 63: as many k-steps' pairs sum in int16 before one `vpmaddwd` as stay below 2^15,
 * int16_steps_fit); else, for the codebook types (IQ4_*, -127..113) and Q8_0 (-127..127, packing.c),
 * |w| times x with w's sign (`vpabsb`, `vpsignb`: |w| once per k-step for all the tile's rows, where
 * |x| was once per row), one step per `vpmaddwd`. */
enum { DOTS_SIGNED = 0, DOTS_AVX_VNNI = 1, DOTS_AVX512_VNNI = 2, DOTS_UNSIGNED = 3 };

/* The bits of a kind's unsigned weights (after its offset) on the maddubs dots. */
static int weight_bits(int kind)
{
    switch (kind) {
    case KIND_Q2_K: return 2;
    case KIND_Q3_K: return 3;
    case KIND_Q5_0: case KIND_Q5_1: case KIND_Q5_K: return 5;
    case KIND_Q6_K_NIBBLES: return 6;
    default: return 4; /* Q4_0, Q4_K, Q4_1_I8 */
    }
}

/* Whether `steps` k-steps of 4 (one vpmaddubsw pair each) may add up in int16 before one vpmaddwd:
 * each pair is at most 2 x 127 x the largest weight in magnitude, the sum of `steps` below 2^15. */
static int int16_steps_fit(int kind, int steps)
{
    return 2 * 127 * ((1 << weight_bits(kind)) - 1) * steps <= 32767;
}

/* The first sub-block of a group scaled without a conversion: its dot starts FLOAT_BIAS's bits higher
 * and ends as the float32 FLOAT_BIAS + D (|D| < 2^22: at most 32 x 128 x 127 here), and
 *     fma(d, FLOAT_BIAS + D, -(d x FLOAT_BIAS)) = round(d x D) = fma(d, (float)D, 0)
 * bit for bit for every finite d: d x FLOAT_BIAS is exact (d has at most 19 significant bits,
 * FLOAT_BIAS 2) and the FMA rounds the exact d x D once (an infinite scale gives NaN here, not
 * infinity). One FMA instead of a conversion and a product, on the ports the dots share (Q4_K on
 * AVX-VNNI: 9% fewer cycles per dot by llvm-mca's Ice Lake model; measured here within the noise).
 * A later sub-block adds to the first's rounded part, so it would keep the conversion. */
#define FLOAT_BIAS 12582912.0f /* 1.5 x 2^23, bits 0x4B400000 */

/* R rows from row0 times panel p of a pair (16 columns, two ymm halves); the group totals live in
 * `total` (L1), added once per group (4 rows, 8 dot chains, read fewer weights per dot but took
 * 5-25% more time on ERNIE's depth-1024 products and gained 5% at depth 3072). The maddubs dots add `chunk` k-steps' pairs in int16
 * before one vpmaddwd (int16_steps_fit); the signed ones (codebook types, Q8_0) one step at a time.
 * The VNNI instruction is written out (VEX encoded) because its intrinsic cannot be inlined into
 * code that also runs without it; it runs only where the CPU reports AVX-VNNI. */
INLINE void avx2_tile(const struct gemm_args *a, const struct int8_acts *x, const struct panel_pair *pp, int p,
                      int sub, int with_min, int dots, int chunk, int R, Py_ssize_t row0, Py_ssize_t col0)
{
    const Py_ssize_t depth = a->depth, groups = depth / GROUP, subs_row = depth / sub;
    const int subs = GROUP / sub, factors = subs * PANEL * (1 + with_min);
    const int8_t *q = x->q + row0 * depth;
    const uint8_t *w = pp->w + p * depth * PANEL;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 float_bias = _mm256_set1_ps(FLOAT_BIAS);
    /* the sub-blocks of 32 on the dot instructions with one accumulator per row and column: with
     * sub-blocks of 16 or the int16 sums of maddubs the two more live registers cost more than they save */
    const int biased = sub == 32 && dots != DOTS_UNSIGNED;
    float total[AVX2_ROWS][PANEL] __attribute__((aligned(32)));
    memset(total, 0, sizeof(total));
    for (Py_ssize_t g = 0; g < groups; g++) {
        const float *f = pp->factors + (g * 2 + p) * factors;
        __m256 part[AVX2_ROWS][2];
        for (int s = 0; s < subs; s++) {
            const Py_ssize_t k0 = g * GROUP + s * sub, at = g * subs + s;
            __m256i dot[AVX2_ROWS][2];
            for (int r = 0; r < R; r++) {
                dot[r][0] = _mm256_set1_epi32(x->init[(row0 + r) * subs_row + at]);
                if (biased) dot[r][0] = _mm256_add_epi32(dot[r][0], _mm256_castps_si256(float_bias));
                dot[r][1] = dot[r][0];
            }
            if (dots == DOTS_AVX_VNNI) {
#pragma GCC unroll 8
                for (int k = 0; k < sub; k += 4) {
                    const uint8_t *wk = w + (k0 + k) * PANEL;
                    const __m256i wa = _mm256_loadu_si256((const __m256i *)wk);
                    const __m256i wb = _mm256_loadu_si256((const __m256i *)(wk + 32));
                    for (int r = 0; r < R; r++) {
                        const __m256i xv = _mm256_set1_epi32(four_bytes(q + r * depth + k0 + k));
                        dot[r][0] = avx_vnni_dot(dot[r][0], wa, xv);
                        dot[r][1] = avx_vnni_dot(dot[r][1], wb, xv);
                    }
                }
            } else if (dots == DOTS_UNSIGNED) {
#pragma GCC unroll 2
                for (int c = 0; c < sub; c += 4 * chunk) {
                    __m256i pairs[AVX2_ROWS][2];
#pragma GCC unroll 8
                    for (int j = 0; j < chunk; j++) {
                        const uint8_t *wk = w + (k0 + c + 4 * j) * PANEL;
                        const __m256i wa = _mm256_loadu_si256((const __m256i *)wk);
                        const __m256i wb = _mm256_loadu_si256((const __m256i *)(wk + 32));
                        for (int r = 0; r < R; r++) {
                            const __m256i xv = _mm256_set1_epi32(four_bytes(q + r * depth + k0 + c + 4 * j));
                            const __m256i ma = _mm256_maddubs_epi16(wa, xv), mb = _mm256_maddubs_epi16(wb, xv);
                            pairs[r][0] = j == 0 ? ma : _mm256_add_epi16(pairs[r][0], ma);
                            pairs[r][1] = j == 0 ? mb : _mm256_add_epi16(pairs[r][1], mb);
                            /* kept a running sum: GCC would otherwise regroup the additions and hold every
                             * product in a register (spilled) */
                            __asm__("" : "+x"(pairs[r][0]), "+x"(pairs[r][1]));
                        }
                    }
                    for (int r = 0; r < R; r++) {
                        for (int h = 0; h < 2; h++) dot[r][h] = _mm256_add_epi32(dot[r][h], _mm256_madd_epi16(pairs[r][h], ones));
                        __asm__("" : "+x"(dot[r][0]), "+x"(dot[r][1]));
                    }
                }
            } else {
#pragma GCC unroll 8
                for (int k = 0; k < sub; k += 4) {
                    const uint8_t *wk = w + (k0 + k) * PANEL;
                    const __m256i wa = _mm256_loadu_si256((const __m256i *)wk);
                    const __m256i wb = _mm256_loadu_si256((const __m256i *)(wk + 32));
                    const __m256i abs_a = _mm256_abs_epi8(wa), abs_b = _mm256_abs_epi8(wb);
                    for (int r = 0; r < R; r++) {
                        const __m256i xv = _mm256_set1_epi32(four_bytes(q + r * depth + k0 + k));
                        dot[r][0] = _mm256_add_epi32(dot[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(abs_a, _mm256_sign_epi8(xv, wa)), ones));
                        dot[r][1] = _mm256_add_epi32(dot[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(abs_b, _mm256_sign_epi8(xv, wb)), ones));
                        __asm__("" : "+x"(dot[r][0]), "+x"(dot[r][1])); /* a running sum, as above */
                    }
                }
            }
            for (int h = 0; h < 2; h++) {
                const __m256 scale = _mm256_loadu_ps(f + s * PANEL + 8 * h);
                const __m256 bias_scaled = _mm256_mul_ps(scale, _mm256_xor_ps(float_bias, _mm256_set1_ps(-0.0f)));
                for (int r = 0; r < R; r++) {
                    __m256 t = biased ? _mm256_fmadd_ps(scale, _mm256_castsi256_ps(dot[r][h]), bias_scaled)
                                      : _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot[r][h]),
                                                        s == 0 ? _mm256_setzero_ps() : part[r][h]);
                    if (with_min)
                        t = _mm256_fmadd_ps(_mm256_loadu_ps(f + (subs + s) * PANEL + 8 * h),
                                            _mm256_set1_ps(x->sum[(row0 + r) * subs_row + at]), t);
                    part[r][h] = t;
                }
            }
        }
        for (int r = 0; r < R; r++) {
            const __m256 sx = _mm256_set1_ps(x->scale[(row0 + r) * groups + g]);
            for (int h = 0; h < 2; h++)
                _mm256_store_ps(total[r] + 8 * h, _mm256_fmadd_ps(part[r][h], sx, _mm256_load_ps(total[r] + 8 * h)));
        }
    }
    const Py_ssize_t start = col0 + p * PANEL, valid = a->cols - start < PANEL ? a->cols - start : PANEL;
    for (int r = 0; r < R && row0 + r < a->rows; r++) {
        float *dst = a->out + (row0 + r) * a->cols + start;
        if (a->bias)
            for (Py_ssize_t n = 0; n < valid; n++) dst[n] = total[r][n] + a->bias[start + n];
        else
            memcpy(dst, total[r], (size_t)valid * sizeof(float));
    }
}

#define AVX2_ROWS_FN(name, sub, with_min, dots, chunk)                                                                \
    static void name(const struct gemm_args *a, const struct int8_acts *x, const struct panel_pair *pp,              \
                     Py_ssize_t col0)                                                                                 \
    {                                                                                                                 \
        const int width = a->cols - col0 > PANEL ? 2 : 1;                                                            \
        for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX2_ROWS)                                                 \
            for (int p = 0; p < width; p++) avx2_tile(a, x, pp, p, sub, with_min, dots, chunk, AVX2_ROWS, row0, col0); \
    }
AVX2_ROWS_FN(signed_rows_32, 32, 0, DOTS_SIGNED, 1) /* the codebook types and Q8_0: sub-blocks of 32, no minimum */
/* maddubs: the whole sub-block in int16 (weights of up to 4 bits; 3 for sub-blocks of 16), or half of it */
AVX2_ROWS_FN(unsigned_rows_32, 32, 0, DOTS_UNSIGNED, 8)
AVX2_ROWS_FN(unsigned_rows_32_half, 32, 0, DOTS_UNSIGNED, 4)
AVX2_ROWS_FN(unsigned_rows_32_min, 32, 1, DOTS_UNSIGNED, 8)
AVX2_ROWS_FN(unsigned_rows_32_min_half, 32, 1, DOTS_UNSIGNED, 4)
AVX2_ROWS_FN(unsigned_rows_16, 16, 0, DOTS_UNSIGNED, 4)
AVX2_ROWS_FN(unsigned_rows_16_half, 16, 0, DOTS_UNSIGNED, 2)
AVX2_ROWS_FN(unsigned_rows_16_min, 16, 1, DOTS_UNSIGNED, 4)
AVX2_ROWS_FN(unsigned_rows_16_min_half, 16, 1, DOTS_UNSIGNED, 2)
AVX2_ROWS_FN(avxvnni_rows_32, 32, 0, DOTS_AVX_VNNI, 1)
AVX2_ROWS_FN(avxvnni_rows_32_min, 32, 1, DOTS_AVX_VNNI, 1)
AVX2_ROWS_FN(avxvnni_rows_16, 16, 0, DOTS_AVX_VNNI, 1)
AVX2_ROWS_FN(avxvnni_rows_16_min, 16, 1, DOTS_AVX_VNNI, 1)
#undef AVX2_ROWS_FN

/* ----------------------------------------------------------- dispatching */
typedef void (*rows_fn)(const struct gemm_args *, const struct int8_acts *, const struct panel_pair *, Py_ssize_t);

/* [dots][sub 32 or 16][with a minimum]; the codebook types (DOTS_SIGNED) have sub-blocks of 32 and no minimum */
static const rows_fn ROWS_FNS[4][2][2] = {
    {{signed_rows_32, NULL}, {NULL, NULL}},
    {{avxvnni_rows_32, avxvnni_rows_32_min}, {avxvnni_rows_16, avxvnni_rows_16_min}},
    {{vnni_rows_32, vnni_rows_32_min}, {vnni_rows_16, vnni_rows_16_min}},
    {{unsigned_rows_32, unsigned_rows_32_min}, {unsigned_rows_16, unsigned_rows_16_min}},
};
/* the maddubs tiles that add half a sub-block in int16 (5- and 6-bit weights) */
static const rows_fn HALF_ROWS_FNS[2][2] = {
    {unsigned_rows_32_half, unsigned_rows_32_min_half}, {unsigned_rows_16_half, unsigned_rows_16_min_half}};

/* The tile function of a product of `kind` with `dots`. */
static rows_fn kind_rows_fn(int kind, int dots)
{
    const int sub16 = block_sub(kind) == 16, with_min = kind_has_min(kind);
    if (dots == DOTS_UNSIGNED && !int16_steps_fit(kind, block_sub(kind) / 4)) return HALF_ROWS_FNS[sub16][with_min];
    return ROWS_FNS[dots][sub16][with_min];
}

/* The dots a product of `kind` runs in `mode`, and the offset its regrouped weights carry. */
static int kind_dots(int kind, int mode)
{
    return mode != MODE_AVX2 ? mode : kind_signed(kind) ? DOTS_SIGNED : DOTS_UNSIGNED;
}

static int weight_offset(int kind, int mode)
{
    const int dots = kind_dots(kind, mode);
    return dots == DOTS_SIGNED ? 0 : dots == DOTS_UNSIGNED ? block_offset(kind) : 128;
}

static int widest_dots = MODE_AVX512_VNNI; /* fd_int8_dots' cap */

int fd_int8_dots(int isa, int widest)
{
    if (widest >= MODE_AVX2 && widest <= MODE_AVX512_VNNI) widest_dots = widest;
    __builtin_cpu_init();
    const int mode = isa == ISA_AVX512 && native_cpu_has_vnni() ? MODE_AVX512_VNNI
                     : __builtin_cpu_supports("avxvnni")           ? MODE_AVX_VNNI
                                                                   : MODE_AVX2;
    return mode < widest_dots ? mode : widest_dots;
}

struct blocks_int8_job {
    const struct gemm_args *a;
    struct int8_acts x;
    int8_t *q;
    float *scale, *sum;
    int32_t *init;
    Py_ssize_t padded_rows;
    int kind, mode;
    volatile int failed; /* a task found no scratch memory */
};

static void quantize_task(void *ctx, Py_ssize_t index, int slot)
{
    struct blocks_int8_job *job = ctx;
    const Py_ssize_t first = index * QUANTIZE_ROWS_PER_TASK, rows = job->a->rows, depth = job->a->depth;
    const Py_ssize_t end = first + QUANTIZE_ROWS_PER_TASK < rows ? first + QUANTIZE_ROWS_PER_TASK : rows;
    quantize_rows(job->a->x, first, end, depth, block_sub(job->kind), weight_offset(job->kind, job->mode), job->q, job->scale,
                  job->init, job->sum);
    (void)slot;
}

/* Task t: panels 2t and 2t + 1 (the second all zero where the matrix ends first). */
static void panel_task(void *ctx, Py_ssize_t t, int slot)
{
    struct blocks_int8_job *job = ctx;
    const struct gemm_args *a = job->a;
    const int kind = job->kind, subs = GROUP / block_sub(kind), legacy = legacy_kind(kind);
    const Py_ssize_t groups = a->depth / GROUP, gbytes = legacy ? legacy_block_bytes(kind) : group_bytes(kind);
    const Py_ssize_t factors = subs * PANEL * (1 + kind_has_min(kind)), panels = (a->cols + PANEL - 1) / PANEL;
    const Py_ssize_t panel_bytes = groups * gbytes;
    const Py_ssize_t w_bytes = a->depth * PANEL * 2, factor_bytes = groups * 2 * factors * (Py_ssize_t)sizeof(float);
    uint8_t *scratch = fd_thread_scratch((size_t)(w_bytes + factor_bytes));
    (void)slot;
    if (scratch == NULL) {
        job->failed = 1;
        return;
    }
    float *f = (float *)(scratch + w_bytes);
    for (int p = 0; p < 2; p++) {
        uint8_t *w = scratch + p * a->depth * PANEL;
        if (2 * t + p >= panels) {
            memset(w, 0, (size_t)a->depth * PANEL);
            for (Py_ssize_t g = 0; g < groups; g++) memset(f + (g * 2 + p) * factors, 0, (size_t)factors * sizeof(float));
            continue;
        }
        const uint8_t *panel = a->packed + (2 * t + p) * panel_bytes;
        if (legacy) {
            legacy_weights(kind, panel, groups, weight_offset(kind, job->mode), w, f, factors, p);
            continue;
        }
        int8_weights(kind, panel, groups, weight_offset(kind, job->mode), w, f, factors, p);
    }
    const struct panel_pair pp = {scratch, f};
    kind_rows_fn(kind, kind_dots(kind, job->mode))(a, &job->x, &pp, 2 * t * PANEL);
}

/* The kind a product of `kind` runs in here: the legacy int8 layouts, or the sub-block kind whose panels
 * an int8 twin reads. */
static int int8_layout(int kind) { return legacy_kind(kind) ? kind : subblock_layout(kind); }

/* the few-row kernels' tiles take 1 or FEW_ROWS rows, the many-row ones a divisor of PAD_ROWS */
static Py_ssize_t padded_rows(Py_ssize_t rows)
{
    return rows <= FEW_ROWS ? FEW_ROWS : (rows + PAD_ROWS - 1) / PAD_ROWS * PAD_ROWS;
}

static size_t acts_bytes(const struct gemm_args *a, int kind)
{
    const Py_ssize_t blocks = a->depth / GROUP, subs = a->depth / block_sub(kind);
    return (size_t)padded_rows(a->rows) * ((size_t)blocks * 4 + (size_t)subs * 8 + (size_t)a->depth);
}

/* A job for `a` whose quantised activations lie in `memory` (acts_bytes of it). */
static struct blocks_int8_job int8_job(const struct gemm_args *a, int isa, char *memory)
{
    const int kind = int8_layout(a->kind);
    const Py_ssize_t padded = padded_rows(a->rows), blocks = a->depth / GROUP, subs = a->depth / block_sub(kind);
    struct blocks_int8_job job = {.a = a, .kind = kind, .mode = fd_int8_dots(isa, -1), .padded_rows = padded};
    job.scale = (float *)memory;
    job.sum = (float *)(memory + (size_t)padded * blocks * 4);
    job.init = (int32_t *)(memory + (size_t)padded * (blocks * 4 + subs * 4));
    job.q = (int8_t *)(memory + (size_t)padded * (blocks * 4 + subs * 8));
    job.x = (struct int8_acts){job.q, job.scale, job.init, job.sum};
    return job;
}

size_t fd_int8_rows_bytes(const struct gemm_args *a)
{
    const int int8 = legacy_kind(a->kind) || is_int8_subblock_kind(a->kind);
    return int8 && a->rows > FEW_ROWS ? acts_bytes(a, int8_layout(a->kind)) : 0;
}

void fd_int8_quantize_rows(const struct gemm_args *a, int isa, void *memory, Py_ssize_t first, Py_ssize_t end)
{
    const struct blocks_int8_job job = int8_job(a, isa, memory);
    quantize_rows(a->x, first, end, a->depth, block_sub(job.kind), weight_offset(job.kind, job.mode), job.q, job.scale,
                  job.init, job.sum);
}

int gemm_blocks_int8(const struct gemm_args *a, int isa, int threads)
{
    const int kind = int8_layout(a->kind);
    if (a->rows <= FEW_ROWS && legacy_kind(kind)) return gemm_int8(a, isa, threads);
    const int few = a->rows <= FEW_ROWS; /* quantised here, whatever a->x_int8 holds (fd_int8_rows_bytes: 0) */
    char *memory = a->x_int8 && !few ? a->x_int8 : PyMem_RawMalloc(acts_bytes(a, kind));
    if (memory == NULL) return -1;
    struct blocks_int8_job job = int8_job(a, isa, memory);
    /* the padding rows: zero activations, scale 0, and dots that start at 0 */
    const Py_ssize_t extra = job.padded_rows - a->rows, blocks = a->depth / GROUP, subs = a->depth / block_sub(kind);
    memset(job.scale + a->rows * blocks, 0, (size_t)extra * blocks * 4);
    memset(job.sum + a->rows * subs, 0, (size_t)extra * subs * 4);
    memset(job.init + a->rows * subs, 0, (size_t)extra * subs * 4);
    memset(job.q + a->rows * a->depth, 0, (size_t)extra * a->depth);
    if (few) {
        quantize_rows(a->x, 0, a->rows, a->depth, block_sub(kind), blocks_int8_rows_offset(kind, job.mode), job.q, job.scale,
                      job.init, job.sum);
        blocks_int8_rows(a, &job.x, kind, job.mode, threads);
        PyMem_RawFree(memory);
        return 0;
    }
    if (a->x_int8 == NULL)
        fd_parallel_for((a->rows + QUANTIZE_ROWS_PER_TASK - 1) / QUANTIZE_ROWS_PER_TASK, threads, quantize_task, &job);
    fd_parallel_for(((a->cols + PANEL - 1) / PANEL + 1) / 2, threads, panel_task, &job);
    if (a->x_int8 == NULL) PyMem_RawFree(memory);
    return job.failed ? -1 : 0;
}
