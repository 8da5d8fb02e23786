/* The sub-block products for AVX2 + FMA CPUs: a v16 is two ymm registers, of 16. */
#pragma GCC target("avx2,fma,f16c") /* what isa.c checks for ISA_AVX2 */
#define VEC_AVX512 0
#define BLOCKS_TASK gemm_blocks_task_avx2
#define FEW_ROWS 2
#define WIDE_ROWS 2
#define BUF_ROWS 6
#define BUF_WIDTH 1
#define ROW_TILE 1 /* 16 ymm: the totals in memory (gemm_blocks.h) */
#include "gemm_blocks.h"
