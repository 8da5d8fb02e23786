/* The sub-block products for AVX-512 CPUs: a v16 is one zmm register, 32 of them. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c") /* what isa.c checks for ISA_AVX512 */
#define VEC_AVX512 1
#define BLOCKS_TASK gemm_blocks_task_avx512
/* up to 16 rows read the blocks directly in 4-row tiles: from 5 rows the float buffer took 3.0-3.6x
 * the 2-row time, two tiles 2.0-2.5x; 9 rows 4.5-5.8x -> 3.4-3.6x, 16 rows 5.5-6.1x -> 5.2-5.6x
 * (ERNIE-shaped Q4_K/Q6_K/Q4_0 layers, one thread; benchmarks/few_rows.py) */
#define FEW_ROWS 16
#define WIDE_ROWS 4
#define BUF_ROWS 6
#define BUF_WIDTH 2
#define ROW_TILE 0
#include "gemm_blocks.h"
