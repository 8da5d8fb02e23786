/* The row kernels for AVX-512 CPUs. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c") /* what isa.c checks for ISA_AVX512 */
#define ROW_KERNELS row_kernels_avx512
#include "row_kernels.h"
