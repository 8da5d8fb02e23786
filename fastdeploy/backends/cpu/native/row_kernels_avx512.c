/* The row kernels for AVX-512 CPUs: 32 zmm registers. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c") /* what isa.c checks for ISA_AVX512 */
#define ROW_KERNELS row_kernels_avx512
#define LANES 16
#define ATTN_CHUNK 64
#define ENCODER_ROWS 6
#define KERNEL_HEADS 4
#define LOAD_F16(p) ((vecf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p))))
#define LOAD_BF16(p) \
    ((vecf)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16)))
#define LOAD_I8(p) ((vecf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))))
#include "row_kernels.h"
