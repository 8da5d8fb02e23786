/*
 * One to FEW_ROWS rows (decode) of the sub-block kinds times int8 activations, read straight from
 * the panels (blocks.h) with the arithmetic of gemm_blocks_int8.c's many-row tiles: per row, column,
 * group and sub-block the exact integer dot D_s, then part = fma(d_s, D_s, part) (and, with a
 * minimum, fma(m_s, sum qx, part)) sub-block after sub-block, out = fma(part, sx, out) group after
 * group, so a row gets the same bits in a product of any row count, instruction set and dot cap.
 *
 * Why: a one-row product reads each weight once, so gemm_blocks_int8.c's regrouping of two panels
 * per task into the dot instructions' order, through memory, costs as much as the product; the
 * float32 kernels instead widen, convert and multiply every weight (3 operations per 8 weights on
 * AVX2). Here each group's integers are decoded in registers straight into the dots' order (each
 * column's 4 consecutive k in one 32-bit lane): a 64-byte chunk of nibbles is [4 k][16 columns]
 * for both its low and its high nibbles (blocks.h), so one transposition of the raw chunk serves 8 k
 * (the plane of high bits, of the 5-bit types and of Q6_K's int8 layout KIND_Q6_K_NIBBLES, has the
 * same shape and is transposed once per group): AVX-512 `vpermb` (AVX512_VBMI, checked at run time) or `vpermd` and `vpshufb`; AVX2
 * `vpermd`, `vpunpck[lh]qdq` and `vpshufb`, which leave columns 0-3 and 8-11 in one ymm and 4-7 and
 * 12-15 in the other (the factors follow the same order, the totals are put back on the store).
 * The weights stay unsigned where a dot needs them so: gguf's integer before its offset (the offset
 * folds into each sub-block's starting value, -offset sum qx), the codebook types through their
 * codebook + 128 (VNNI) or signed with the sign trick (maddubs; gemm_blocks_int8.c's DOTS_SIGNED).
 * Tiles: 4 rows (AVX-512) or 2 (AVX2) of one panel, or (AVX-512) one row of two panels at once (two
 * streams of weights and independent dots in flight), panels in tasks of eight.
 * A decode token's weights are about as large as the caches, so these products run near the rate at
 * which two threads stream them; prefetching PREFETCH_BYTES ahead matters as much as the operations.
 */
#pragma GCC target("avx2,fma,f16c") /* what isa.c checks for ISA_AVX2; the AVX-512 code adds its own */
#include "blocks_int8.h"

#include "block_quants.h"

#define INLINE static inline __attribute__((always_inline))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
/* panels per task, read one after another by the thread that claims it: tasks of 8 rather than 4 streamed
 * 5-20% more G weights/s with the AVX2 kernels past the caches (one row, two threads, ERNIE's
 * [3072 x 1024], Q4_0/Q4_K/Q5_K/Q6_K; AVX2 Q4_0 decode 53-71 -> 71-81 tok/s) and were within the
 * noise with AVX-512 */
#define PANELS_PER_TASK 8
#define AVX512_TILE 4 /* rows */
#define AVX2_TILE 2

enum { DOTS_VNNI, DOTS_SIGNED, DOTS_UNSIGNED }; /* the AVX2 tile's dots: AVX-VNNI, maddubs signed or unsigned */

int blocks_int8_rows_offset(int kind, int mode)
{
    if (block_codebook(kind)) return mode == MODE_AVX2 ? 0 : 128;
    return block_offset(kind);
}

/* The k-steps (of 4) whose maddubs pairs add up in int16 before one vpmaddwd: each pair is at most
 * 2 x 127 x the largest unsigned weight, the sum below 2^15; a power of two that divides the sub-block. */
INLINE int int16_steps(int kind)
{
    const int largest = (16 << block_high_bits(kind)) - 1;
    int steps = block_sub(kind) / 4;
    while (2 * 127 * largest * steps > 32767) steps /= 2;
    return steps;
}

/* ------------------------------------------------------------- AVX-512 VNNI */
/* [4 k][16 columns] bytes into [16 columns][4 k] */
INLINE AVX512_TARGET __m512i zmm_dot_order(__m512i v, int vbmi)
{
    if (vbmi) {
        const __m512i index = _mm512_set_epi8(63, 47, 31, 15, 62, 46, 30, 14, 61, 45, 29, 13, 60, 44, 28, 12, 59, 43, 27,
                                              11, 58, 42, 26, 10, 57, 41, 25, 9, 56, 40, 24, 8, 55, 39, 23, 7, 54, 38, 22,
                                              6, 53, 37, 21, 5, 52, 36, 20, 4, 51, 35, 19, 3, 50, 34, 18, 2, 49, 33, 17, 1,
                                              48, 32, 16, 0);
        __m512i out;
        /* written out: its intrinsic cannot be inlined into code that also runs without AVX512_VBMI */
        __asm__("vpermb %2, %1, %0" : "=v"(out) : "v"(index), "v"(v));
        return out;
    }
    const __m512i dwords = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i bytes = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    return _mm512_shuffle_epi8(_mm512_permutexvar_epi32(dwords, v), bytes);
}

/* the transposed plane shifted left by `shift` (right where negative): blocks.h's high_bits_shift */
INLINE AVX512_TARGET __m512i zmm_plane_bits(__m512i plane, int shift)
{
    if (shift > 0) return _mm512_slli_epi16(plane, (unsigned)shift);
    if (shift < 0) return _mm512_srli_epi16(plane, (unsigned)-shift);
    return plane;
}

/* A group's integers in the dots' order, unsigned: w[t] holds k 4t .. 4t + 3 of the 16 columns. */
INLINE AVX512_TARGET void zmm_group_ints(int kind, int vbmi, const uint8_t *grp, __m512i w[8])
{
    const uint8_t *nibbles = grp + group_nibble_offset(kind);
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512i plane[2];
    for (int b = 0; b < block_high_bits(kind); b++) /* b chunks of 64 bytes */
        plane[b] = zmm_dot_order(_mm512_loadu_si512(grp + group_plane_offset(kind) + 64 * b), vbmi);
    const __m512i book = block_codebook(kind)
                             ? _mm512_broadcast_i32x4(_mm_add_epi8(_mm_loadu_si128((const __m128i *)block_codebook_values(kind)),
                                                                   _mm_set1_epi8((char)0x80)))
                             : low;
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i v = zmm_dot_order(_mm512_loadu_si512(nibbles + 64 * c), vbmi);
        __m512i q[2] = {_mm512_and_si512(v, low), _mm512_and_si512(_mm512_srli_epi16(v, 4), low)};
        for (int h = 0; h < 2; h++) {
            const int s = 2 * c + h;
            if (block_high_bits(kind)) /* q | (bits & mask) */
                q[h] = _mm512_ternarylogic_epi32(q[h], zmm_plane_bits(plane[high_bits_chunk(kind, s)], high_bits_shift(kind, s)),
                                                 _mm512_set1_epi8((char)high_bits_mask(kind)), 0xF8);
            if (block_codebook(kind)) q[h] = _mm512_shuffle_epi8(book, q[h]);
            w[2 * c + h] = q[h];
        }
    }
}

/* R rows from row0 times P panels from `panel` (one row: two panels at once, two streams of weights
 * and twice the independent dots in flight). */
INLINE AVX512_TARGET void zmm_panels(int kind, int vbmi, int R, int P, const struct gemm_args *a, const struct int8_acts *x,
                                     Py_ssize_t row0, Py_ssize_t panel)
{
    const int sub = block_sub(kind), subs = GROUP / sub, with_min = block_has_min(kind);
    const Py_ssize_t depth = a->depth, groups = depth / GROUP, subs_row = depth / sub, gbytes = group_bytes(kind);
    const uint8_t *base = a->packed + panel * groups * gbytes;
    const int8_t *q = x->q + row0 * depth;
    _Alignas(64) float f[2][GROUP_FACTORS];
    __m512 total[2][AVX512_TILE];
    for (int p = 0; p < P; p++)
        for (int r = 0; r < R; r++) total[p][r] = _mm512_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g++) {
        __m512i w[2][8];
        for (int p = 0; p < P; p++) {
            const uint8_t *grp = base + (p * groups + g) * gbytes;
            prefetch_ahead(grp, gbytes);
            group_factors(kind, grp, f[p]);
            zmm_group_ints(kind, vbmi, grp, w[p]);
        }
        __m512 part[2][AVX512_TILE];
#pragma GCC unroll 2
        for (int s = 0; s < subs; s++) {
            const Py_ssize_t at = g * subs + s;
            __m512i dot[2][AVX512_TILE];
            for (int r = 0; r < R; r++) dot[0][r] = dot[1][r] = _mm512_set1_epi32(x->init[(row0 + r) * subs_row + at]);
#pragma GCC unroll 8
            for (int t = s * sub / 4; t < (s + 1) * sub / 4; t++)
                for (int r = 0; r < R; r++) {
                    const __m512i xv = _mm512_set1_epi32(four_bytes(q + r * depth + g * GROUP + 4 * t));
                    for (int p = 0; p < P; p++) dot[p][r] = _mm512_dpbusd_epi32(dot[p][r], w[p][t], xv);
                }
            for (int p = 0; p < P; p++) {
                const __m512 scale = _mm512_load_ps(f[p] + s * PANEL);
                for (int r = 0; r < R; r++) {
                    __m512 t = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot[p][r]), s == 0 ? _mm512_setzero_ps() : part[p][r]);
                    if (with_min)
                        t = _mm512_fmadd_ps(_mm512_load_ps(f[p] + (subs + s) * PANEL),
                                            _mm512_set1_ps(x->sum[(row0 + r) * subs_row + at]), t);
                    part[p][r] = t;
                }
            }
        }
        for (int r = 0; r < R; r++) {
            const __m512 sx = _mm512_set1_ps(x->scale[(row0 + r) * groups + g]);
            for (int p = 0; p < P; p++) total[p][r] = _mm512_fmadd_ps(part[p][r], sx, total[p][r]);
        }
    }
    for (int p = 0; p < P; p++) {
        const Py_ssize_t start = (panel + p) * PANEL, valid = a->cols - start < PANEL ? a->cols - start : PANEL;
        const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
        const __m512 bias = a->bias ? _mm512_maskz_loadu_ps(mask, a->bias + start) : _mm512_setzero_ps();
        for (int r = 0; r < R && row0 + r < a->rows; r++)
            _mm512_mask_storeu_ps(a->out + (row0 + r) * a->cols + start, mask,
                                  a->bias ? _mm512_add_ps(total[p][r], bias) : total[p][r]);
    }
}

/* All rows times panels [first, end): AVX512_TILE rows (padded) per panel, or one row two panels at a time. */
INLINE AVX512_TARGET void zmm_rows(int kind, int vbmi, const struct gemm_args *a, const struct int8_acts *x, Py_ssize_t first,
                                   Py_ssize_t end)
{
    for (Py_ssize_t p = first; p < end; p += a->rows == 1 && p + 1 < end ? 2 : 1)
        if (a->rows > 1) zmm_panels(kind, vbmi, AVX512_TILE, 1, a, x, 0, p);
        else if (p + 1 < end) zmm_panels(kind, vbmi, 1, 2, a, x, 0, p);
        else zmm_panels(kind, vbmi, 1, 1, a, x, 0, p);
}

/* ------------------------------------------------------------------- AVX2 */
/* 64 bytes [4 k][16 columns] into the dots' order: lo holds columns 0-3 and 8-11, hi 4-7 and 12-15 */
INLINE void ymm_dot_order(const uint8_t *p, __m256i *lo, __m256i *hi)
{
    const __m256i pairs = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i bytes = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    const __m256i a = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)p), pairs);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(p + 32)), pairs);
    *lo = _mm256_shuffle_epi8(_mm256_unpacklo_epi64(a, b), bytes);
    *hi = _mm256_shuffle_epi8(_mm256_unpackhi_epi64(a, b), bytes);
}

/* Steps 2c and 2c + 1 (k 8c .. 8c + 7) of a group in the dots' order: w[2h + i] is step 2c + h's
 * half i (lo, hi); unsigned, or for DOTS_SIGNED the codebook's signed values. */
INLINE void ymm_chunk_ints(int kind, int dots, const uint8_t *grp, int c, const __m256i plane[2][2], __m256i w[4])
{
    const uint8_t *nibbles = grp + group_nibble_offset(kind);
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i v[2];
    ymm_dot_order(nibbles + 64 * c, &v[0], &v[1]);
    __m128i book = _mm_loadu_si128((const __m128i *)block_codebook_values(kind));
    if (dots != DOTS_SIGNED) book = _mm_add_epi8(book, _mm_set1_epi8((char)0x80));
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 2; i++) {
            __m256i q = _mm256_and_si256(h ? _mm256_srli_epi16(v[i], 4) : v[i], low);
            const int s = 2 * c + h;
            if (block_high_bits(kind))
                q = _mm256_or_si256(q, _mm256_and_si256(plane_bits_at(plane[high_bits_chunk(kind, s)][i], high_bits_shift(kind, s)),
                                                        _mm256_set1_epi8((char)high_bits_mask(kind))));
            if (block_codebook(kind)) q = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(book), q);
            w[2 * h + i] = q;
        }
}

/* 16 floats (columns 0-15) in the AVX2 tile's order: 0-3 and 8-11, then 4-7 and 12-15 */
INLINE void ymm_tile_order(const float *p, __m256 out[2])
{
    const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
    out[0] = _mm256_permute2f128_ps(a, b, 0x20);
    out[1] = _mm256_permute2f128_ps(a, b, 0x31);
}

/* R rows from row0 times one panel; `dots` as the enum. The VNNI instruction is written out (VEX
 * encoded) because its intrinsic cannot be inlined into code that also runs without it. */
INLINE void ymm_panel(int kind, int dots, int R, const struct gemm_args *a, const struct int8_acts *x, Py_ssize_t row0,
                      Py_ssize_t panel)
{
    const int sub = block_sub(kind), subs = GROUP / sub, with_min = block_has_min(kind), steps = int16_steps(kind);
    const Py_ssize_t depth = a->depth, groups = depth / GROUP, subs_row = depth / sub, gbytes = group_bytes(kind);
    const uint8_t *base = a->packed + panel * groups * gbytes;
    const int8_t *q = x->q + row0 * depth;
    const __m256i ones = _mm256_set1_epi16(1);
    _Alignas(32) float f[GROUP_FACTORS];
    __m256 total[AVX2_TILE][2];
    for (int r = 0; r < R; r++) total[r][0] = total[r][1] = _mm256_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g++) {
        const uint8_t *grp = base + g * gbytes;
        prefetch_ahead(grp, gbytes);
        group_factors(kind, grp, f);
        __m256i plane[2][2];
        for (int b = 0; b < block_high_bits(kind); b++)
            ymm_dot_order(grp + group_plane_offset(kind) + 64 * b, &plane[b][0], &plane[b][1]);
        __m256 part[AVX2_TILE][2];
#pragma GCC unroll 2
        for (int s = 0; s < subs; s++) {
            const Py_ssize_t at = g * subs + s;
            __m256i dot[AVX2_TILE][2], pairs[AVX2_TILE][2];
            for (int r = 0; r < R; r++) dot[r][0] = dot[r][1] = _mm256_set1_epi32(x->init[(row0 + r) * subs_row + at]);
#pragma GCC unroll 4
            for (int c = s * sub / 8; c < (s + 1) * sub / 8; c++) {
                __m256i w[4];
                ymm_chunk_ints(kind, dots, grp, c, plane, w);
                for (int h = 0; h < 2; h++) {
                    const int t = 2 * c + h, j = t - s * sub / 4; /* step within the sub-block */
                    __m256i magnitude[2];
                    if (dots == DOTS_SIGNED)
                        for (int i = 0; i < 2; i++) magnitude[i] = _mm256_abs_epi8(w[2 * h + i]);
                    for (int r = 0; r < R; r++) {
                        const __m256i xv = _mm256_set1_epi32(four_bytes(q + r * depth + g * GROUP + 4 * t));
                        for (int i = 0; i < 2; i++) {
                            if (dots == DOTS_VNNI) {
                                dot[r][i] = avx_vnni_dot(dot[r][i], w[2 * h + i], xv);
                            } else if (dots == DOTS_SIGNED) {
                                const __m256i m = _mm256_maddubs_epi16(magnitude[i], _mm256_sign_epi8(xv, w[2 * h + i]));
                                dot[r][i] = _mm256_add_epi32(dot[r][i], _mm256_madd_epi16(m, ones));
                            } else {
                                const __m256i m = _mm256_maddubs_epi16(w[2 * h + i], xv);
                                pairs[r][i] = j % steps == 0 ? m : _mm256_add_epi16(pairs[r][i], m);
                                /* kept a running sum: GCC would otherwise hold every product (spilled)
                                 * and add them up at the end, as in gemm_blocks_int8.c */
                                __asm__("" : "+x"(pairs[r][i]));
                                if ((j + 1) % steps == 0)
                                    dot[r][i] = _mm256_add_epi32(dot[r][i], _mm256_madd_epi16(pairs[r][i], ones));
                            }
                            __asm__("" : "+x"(dot[r][i]));
                        }
                    }
                }
            }
            __m256 scale[2], minimum[2];
            ymm_tile_order(f + s * PANEL, scale);
            if (with_min) ymm_tile_order(f + (subs + s) * PANEL, minimum);
            for (int r = 0; r < R; r++)
                for (int i = 0; i < 2; i++) {
                    __m256 p = _mm256_fmadd_ps(scale[i], _mm256_cvtepi32_ps(dot[r][i]), s == 0 ? _mm256_setzero_ps() : part[r][i]);
                    if (with_min) p = _mm256_fmadd_ps(minimum[i], _mm256_set1_ps(x->sum[(row0 + r) * subs_row + at]), p);
                    part[r][i] = p;
                }
        }
        for (int r = 0; r < R; r++) {
            const __m256 sx = _mm256_set1_ps(x->scale[(row0 + r) * groups + g]);
            for (int i = 0; i < 2; i++) total[r][i] = _mm256_fmadd_ps(part[r][i], sx, total[r][i]);
        }
    }
    const Py_ssize_t start = panel * PANEL, valid = a->cols - start < PANEL ? a->cols - start : PANEL;
    for (int r = 0; r < R && row0 + r < a->rows; r++) {
        _Alignas(32) float t[PANEL];
        _mm256_store_ps(t, _mm256_permute2f128_ps(total[r][0], total[r][1], 0x20));
        _mm256_store_ps(t + 8, _mm256_permute2f128_ps(total[r][0], total[r][1], 0x31));
        float *dst = a->out + (row0 + r) * a->cols + start;
        for (Py_ssize_t n = 0; n < valid; n++) dst[n] = a->bias ? t[n] + a->bias[start + n] : t[n];
    }
}

/* All rows times panels [first, end), one panel at a time: more rows AVX2_TILE at a time, one row alone
 * (two panels at once, one stream each, were 6% faster for Q6_K when its integers were bytes; with its
 * nibbles and high bits within the noise, and Q5_K 17% slower: the planes' registers) */
INLINE void ymm_rows(int kind, int dots, const struct gemm_args *a, const struct int8_acts *x, Py_ssize_t first, Py_ssize_t end)
{
    for (Py_ssize_t p = first; p < end; p++)
        if (a->rows > 1)
            for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX2_TILE) ymm_panel(kind, dots, AVX2_TILE, a, x, row0, p);
        else ymm_panel(kind, dots, 1, a, x, 0, p);
}

/* ----------------------------------------------------------- dispatching */
/* all rows of a product times panels [first, end), per kind and dots */
typedef void (*panel_fn)(const struct gemm_args *a, const struct int8_acts *x, Py_ssize_t first, Py_ssize_t end);

#define PANEL_FNS(K)                                                                                                  \
    static AVX512_TARGET void zmm_##K(const struct gemm_args *a, const struct int8_acts *x, Py_ssize_t first,          \
                                      Py_ssize_t end)                                                                 \
    {                                                                                                                 \
        zmm_rows(KIND_##K, 0, a, x, first, end);                                                                      \
    }                                                                                                                 \
    static AVX512_TARGET void vbmi_##K(const struct gemm_args *a, const struct int8_acts *x, Py_ssize_t first,         \
                                       Py_ssize_t end)                                                                \
    {                                                                                                                 \
        zmm_rows(KIND_##K, 1, a, x, first, end);                                                                      \
    }                                                                                                                 \
    static void avxvnni_##K(const struct gemm_args *a, const struct int8_acts *x, Py_ssize_t first, Py_ssize_t end)  \
    {                                                                                                                 \
        ymm_rows(KIND_##K, DOTS_VNNI, a, x, first, end);                                                             \
    }                                                                                                                 \
    static void maddubs_##K(const struct gemm_args *a, const struct int8_acts *x, Py_ssize_t first, Py_ssize_t end)  \
    {                                                                                                                 \
        ymm_rows(KIND_##K, block_codebook(KIND_##K) ? DOTS_SIGNED : DOTS_UNSIGNED, a, x, first, end);                \
    }
PANEL_FNS(Q4_0)
PANEL_FNS(Q5_0)
PANEL_FNS(Q5_1)
PANEL_FNS(Q2_K)
PANEL_FNS(Q3_K)
PANEL_FNS(Q4_K)
PANEL_FNS(Q5_K)
PANEL_FNS(Q6_K_NIBBLES)
PANEL_FNS(IQ4_NL)
PANEL_FNS(IQ4_XS)
#undef PANEL_FNS

enum { VARIANT_MADDUBS, VARIANT_AVX_VNNI, VARIANT_AVX512, VARIANT_VBMI, VARIANTS };

#define PANEL_ROW(K) {maddubs_##K, avxvnni_##K, zmm_##K, vbmi_##K}
/* [float32 kind - KIND_Q4_0][variant] (Q6_K's row reads KIND_Q6_K_NIBBLES) */
static const panel_fn PANEL_FN_TABLE[][VARIANTS] = {
    PANEL_ROW(Q4_0), PANEL_ROW(Q5_0), PANEL_ROW(Q5_1),        PANEL_ROW(Q2_K),   PANEL_ROW(Q3_K),
    PANEL_ROW(Q4_K), PANEL_ROW(Q5_K), PANEL_ROW(Q6_K_NIBBLES), PANEL_ROW(IQ4_NL), PANEL_ROW(IQ4_XS),
};
#undef PANEL_ROW

struct rows_job {
    const struct gemm_args *a;
    const struct int8_acts *x;
    panel_fn fn;
    Py_ssize_t panels;
};

static void rows_task(void *ctx, Py_ssize_t task, int slot)
{
    const struct rows_job *job = ctx;
    const Py_ssize_t first = task * PANELS_PER_TASK;
    const Py_ssize_t end = first + PANELS_PER_TASK < job->panels ? first + PANELS_PER_TASK : job->panels;
    job->fn(job->a, job->x, first, end);
    (void)slot;
}

static int vbmi_allowed = 1; /* blocks_int8_rows_vbmi's switch */

int blocks_int8_rows_vbmi(int allow)
{
    if (allow == 0 || allow == 1) vbmi_allowed = allow;
    __builtin_cpu_init();
    return vbmi_allowed && __builtin_cpu_supports("avx512vbmi");
}

void blocks_int8_rows(const struct gemm_args *a, const struct int8_acts *x, int kind, int mode, int threads)
{
    const int variant = mode == MODE_AVX512_VNNI ? (blocks_int8_rows_vbmi(-1) ? VARIANT_VBMI : VARIANT_AVX512)
                        : mode == MODE_AVX_VNNI  ? VARIANT_AVX_VNNI
                                                 : VARIANT_MADDUBS;
    const Py_ssize_t panels = (a->cols + PANEL - 1) / PANEL;
    struct rows_job job = {a, x, PANEL_FN_TABLE[block_gguf_kind(kind) - KIND_Q4_0][variant], panels};
    fd_parallel_for((panels + PANELS_PER_TASK - 1) / PANELS_PER_TASK, threads, rows_task, &job);
}
