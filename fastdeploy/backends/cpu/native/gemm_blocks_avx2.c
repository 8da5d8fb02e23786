/* The sub-block products for AVX2 + FMA CPUs: a v16 is two ymm registers, of 16. */
#pragma GCC target("avx2,fma,f16c") /* what isa.c checks for ISA_AVX2 */
#define VEC_AVX512 0
#define BLOCKS_TASK gemm_blocks_task_avx2
/* Up to 8 rows read the blocks directly, in tiles of up to 4 rows over both panels of a pair: the
 * float buffer's widening of every panel made a 3-row product 2.1-2.8x as long as a 2-row one, the
 * 4-row tile (its 8 sums alone fill the 16 ymm registers) 1.3-1.5x; two such tiles still beat the
 * buffer at 5-8 rows (ERNIE-shaped Q4_K/Q6_K/Q4_0 layers: 5 rows 2.6-3.0x -> 2.3-2.7x, 8 rows
 * 3.3-5.5x -> 3.1-4.0x the 2-row time; benchmarks/few_rows.py) */
#define FEW_ROWS 8
#define WIDE_ROWS 4
#define BUF_ROWS 6
#define BUF_WIDTH 1
#define ROW_TILE 1 /* 16 ymm: the totals in memory (gemm_blocks.h) */
#include "gemm_blocks.h"
