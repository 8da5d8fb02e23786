/* The row kernels for AVX2 + FMA CPUs: 16 ymm registers. */
#pragma GCC target("avx2,fma,f16c") /* what isa.c checks for ISA_AVX2 */
#define ROW_KERNELS row_kernels_avx2
#define LANES 8
#define ATTN_CHUNK 32
#define ENCODER_ROWS 2
#define KERNEL_HEADS 2
#define LOAD_F16(p) ((vecf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
#define LOAD_BF16(p) \
    ((vecf)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16)))
#define LOAD_I8(p) ((vecf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))))
#include "row_kernels.h"
