/*
 * The integers and factors of a sub-block panel group (blocks.h) decoded whole, as the float32
 * kernels (gemm_blocks.h) and the int8 ones (gemm_blocks_int8.c) read them. Include it where an AVX2 (or
 * wider) target is already set: the intrinsics cannot be inlined into a function without one. With
 * AVX-512 BW set (gemm_blocks_avx512.c) the decode takes 64 bytes per operation, else 32.
 */
#ifndef FASTDEPLOY_BLOCK_QUANTS_H
#define FASTDEPLOY_BLOCK_QUANTS_H

#include "blocks.h"

#include <immintrin.h>

#define GROUP_INTS (GROUP * PANEL) /* decoded bytes of a group: [32 k][16 columns] */
#define GROUP_FACTORS (2 * 2 * PANEL) /* floats of a group's factors, at most: [2 sub-blocks][16] scales, minimums */

#if defined(__AVX512BW__)
/* The group's float32 scales [32 / S][16], then (types with a minimum) minimums [32 / S][16], into
 * out[GROUP_FACTORS]: d times sc and -(dmin times m) as gguf multiplies them, the float16 factors alone
 * for the 32-weight types (blocks.h). */
static inline __attribute__((always_inline)) void group_factors(int kind, const uint8_t *grp, float *out)
{
    const int subs = GROUP / block_sub(kind), with_min = block_has_min(kind);
    if (kind == KIND_MXFP4) {
        _mm512_storeu_ps(out, _mm512_loadu_ps(grp));
        return;
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)grp));
    const __m512 dmin = with_min ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(grp + group_dmin_offset(kind)))) : d;
    if (!block_factor_ints(kind)) {
        _mm512_storeu_ps(out, d);
        if (with_min) _mm512_storeu_ps(out + PANEL, dmin);
        return;
    }
#pragma GCC unroll 2
    for (int s = 0; s < subs; s++) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)(grp + group_sc_offset(kind) + s * PANEL));
        _mm512_storeu_ps(out + s * PANEL, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc))));
        if (with_min) {
            const __m128i m = _mm_loadu_si128((const __m128i *)(grp + group_m_offset(kind) + s * PANEL));
            const __m512 product = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(m)));
            _mm512_storeu_ps(out + (subs + s) * PANEL, _mm512_castsi512_ps(_mm512_xor_si512(
                                                           _mm512_castps_si512(product), _mm512_set1_epi32(INT32_MIN))));
        }
    }
}

/* the plane shifted so that decoded vector s's high bits are at bit 4 (blocks.h: high_bits_shift) */
static inline __attribute__((always_inline)) __m512i plane_bits_at(__m512i plane, int shift_left)
{
    if (shift_left > 0) return _mm512_slli_epi16(plane, (unsigned)shift_left);
    if (shift_left < 0) return _mm512_srli_epi16(plane, (unsigned)-shift_left);
    return plane;
}

/* decoded vector s (k 4s .. 4s + 3) from its nibbles, with the plane's bits, offset or codebook */
static inline __attribute__((always_inline)) __m512i finish_ints(int kind, __m512i q, const uint8_t *plane, int s)
{
    if (block_high_bits(kind)) /* q | (p & mask) */
        q = _mm512_ternarylogic_epi32(q, plane_bits_at(_mm512_loadu_si512(plane + 64 * high_bits_chunk(kind, s)), high_bits_shift(kind, s)),
                                      _mm512_set1_epi8((char)high_bits_mask(kind)), 0xF8);
    if (block_codebook(kind))
        q = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)block_codebook_values(kind))), q);
    if (block_offset(kind)) q = _mm512_sub_epi8(q, _mm512_set1_epi8((char)block_offset(kind)));
    return q;
}

/* The group's integers into out[GROUP_INTS] (64-byte aligned): that of (k, n) at 16 k + n. */
static inline __attribute__((always_inline)) void group_decode(int kind, const uint8_t *grp, int8_t *out)
{
    const uint8_t *nibbles = grp + group_nibble_offset(kind), *plane = grp + group_plane_offset(kind);
    const __m512i low = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_loadu_si512(nibbles + 64 * c);
        _mm512_store_si512(out + 128 * c, finish_ints(kind, _mm512_and_si512(v, low), plane, 2 * c));
        _mm512_store_si512(out + 128 * c + 64,
                           finish_ints(kind, _mm512_and_si512(_mm512_srli_epi16(v, 4), low), plane, 2 * c + 1));
    }
}
#else
/* The group's factors, as the AVX-512 group_factors, 8 columns at a time. */
static inline __attribute__((always_inline)) void group_factors(int kind, const uint8_t *grp, float *out)
{
    const int subs = GROUP / block_sub(kind), with_min = block_has_min(kind);
    if (kind == KIND_MXFP4) {
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + 8 * h, _mm256_loadu_ps((const float *)grp + 8 * h));
        return;
    }
    const __m256 sign = _mm256_set1_ps(-0.0f);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* columns 8h .. 8h + 7 */
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + 16 * h)));
        const __m256 dmin =
            with_min ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + group_dmin_offset(kind) + 16 * h))) : d;
        if (!block_factor_ints(kind)) {
            _mm256_storeu_ps(out + 8 * h, d);
            if (with_min) _mm256_storeu_ps(out + PANEL + 8 * h, dmin);
            continue;
        }
#pragma GCC unroll 2
        for (int s = 0; s < subs; s++) {
            const __m128i sc = _mm_loadl_epi64((const __m128i *)(grp + group_sc_offset(kind) + s * PANEL + 8 * h));
            _mm256_storeu_ps(out + s * PANEL + 8 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
            if (with_min) {
                const __m128i m = _mm_loadl_epi64((const __m128i *)(grp + group_m_offset(kind) + s * PANEL + 8 * h));
                const __m256 product = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(m)));
                _mm256_storeu_ps(out + (subs + s) * PANEL + 8 * h, _mm256_xor_ps(product, sign));
            }
        }
    }
}

static inline __attribute__((always_inline)) __m256i plane_bits_at(__m256i plane, int shift_left)
{
    if (shift_left > 0) return _mm256_slli_epi16(plane, shift_left);
    if (shift_left < 0) return _mm256_srli_epi16(plane, -shift_left);
    return plane;
}

/* half h (32 bytes) of decoded vector s, as the AVX-512 finish_ints */
static inline __attribute__((always_inline)) __m256i finish_ints(int kind, __m256i q, const uint8_t *plane, int s, int h)
{
    if (block_high_bits(kind)) {
        const __m256i p = _mm256_loadu_si256((const __m256i *)(plane + 64 * high_bits_chunk(kind, s) + 32 * h));
        q = _mm256_or_si256(q, _mm256_and_si256(plane_bits_at(p, high_bits_shift(kind, s)), _mm256_set1_epi8((char)high_bits_mask(kind))));
    }
    if (block_codebook(kind))
        q = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)block_codebook_values(kind))), q);
    if (block_offset(kind)) q = _mm256_sub_epi8(q, _mm256_set1_epi8((char)block_offset(kind)));
    return q;
}

/* The group's integers into out[GROUP_INTS] (32-byte aligned): that of (k, n) at 16 k + n. */
static inline __attribute__((always_inline)) void group_decode(int kind, const uint8_t *grp, int8_t *out)
{
    const uint8_t *nibbles = grp + group_nibble_offset(kind), *plane = grp + group_plane_offset(kind);
    const __m256i low = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 8
    for (int half = 0; half < 8; half++) {
        const int c = half / 2, h = half % 2;
        const __m256i v = _mm256_loadu_si256((const __m256i *)(nibbles + 64 * c + 32 * h));
        _mm256_store_si256((__m256i *)(out + 128 * c + 32 * h), finish_ints(kind, _mm256_and_si256(v, low), plane, 2 * c, h));
        _mm256_store_si256((__m256i *)(out + 128 * c + 64 + 32 * h),
                           finish_ints(kind, _mm256_and_si256(_mm256_srli_epi16(v, 4), low), plane, 2 * c + 1, h));
    }
}
#endif

/* The group's integers, [32 k][16 columns] int8: the stored bytes themselves, or decoded into
 * scratch[GROUP_INTS] (64-byte aligned). */
static inline __attribute__((always_inline)) const int8_t *group_ints(int kind, const uint8_t *grp, int8_t *scratch)
{
    if (block_bytewise(kind)) return (const int8_t *)(grp + group_nibble_offset(kind));
    group_decode(kind, grp, scratch);
    return scratch;
}

#endif
