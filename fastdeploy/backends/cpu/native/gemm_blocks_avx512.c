/* The sub-block products for AVX-512 CPUs: a v16 is one zmm register, 32 of them. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c") /* what isa.c checks for ISA_AVX512 */
#define VEC_AVX512 1
#define BLOCKS_TASK gemm_blocks_task_avx512
#define FEW_ROWS 4
#define WIDE_ROWS 4
#define BUF_ROWS 6
#define BUF_WIDTH 2
#define ROW_TILE 0
#include "gemm_blocks.h"
