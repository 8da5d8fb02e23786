/*
 * The integers of a sub-block panel group (blocks.h) one k at a time, as the float32 kernels
 * (gemm_blocks.h) and the int8 ones (gemm_blocks_int8.c) read them. Include it where an AVX2 (or
 * wider) target is already set: the intrinsics cannot be inlined into a function without one.
 */
#ifndef FASTDEPLOY_BLOCK_QUANTS_H
#define FASTDEPLOY_BLOCK_QUANTS_H

#include "blocks.h"

#include <immintrin.h>

/* The integers of row k (0..31) of a panel group, its 16 columns as int8 (layout: blocks.h). */
static inline __attribute__((always_inline)) __m128i block_quants(int kind, const uint8_t *grp, int k)
{
    if (block_bytewise(kind)) return _mm_loadu_si128((const __m128i *)(grp + group_nibble_offset(kind) + PANEL * k));
    __m128i q = _mm_loadu_si128((const __m128i *)(grp + group_nibble_offset(kind) + PANEL * (k / 2)));
    if (k % 2) q = _mm_srli_epi16(q, 4);
    q = _mm_and_si128(q, _mm_set1_epi8(0x0F));
    if (block_codebook(kind)) q = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)block_codebook_values(kind)), q);
    if (block_offset(kind)) q = _mm_sub_epi8(q, _mm_set1_epi8((char)block_offset(kind)));
    return q;
}

#endif
