/* The row kernels for AVX2 + FMA CPUs: 16 ymm registers. */
#pragma GCC target("avx2,fma,f16c") /* what isa.c checks for ISA_AVX2 */
#define ROW_KERNELS row_kernels_avx2
#define LANES 8
#define ATTN_CHUNK 32
#define KERNEL_HEADS 2
#include "row_kernels.h"
