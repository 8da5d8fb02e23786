/* The row kernels for AVX2 + FMA CPUs. */
#pragma GCC target("avx2,fma,f16c") /* what isa.c checks for ISA_AVX2 */
#define ROW_KERNELS row_kernels_avx2
#include "row_kernels.h"
