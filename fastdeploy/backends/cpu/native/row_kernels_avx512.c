/* The row kernels for AVX-512 CPUs: 32 zmm registers. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c") /* what isa.c checks for ISA_AVX512 */
#define ROW_KERNELS row_kernels_avx512
#define LANES 16
#define ATTN_CHUNK 64
#define KERNEL_HEADS 4
#include "row_kernels.h"
