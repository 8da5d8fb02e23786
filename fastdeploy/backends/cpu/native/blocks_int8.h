/*
 * What the int8-activation products of the sub-block kinds (gemm_blocks_int8.c) share with their
 * one- to FEW_ROWS-row kernels (gemm_blocks_int8_rows.c): the quantised activations and the dots.
 */
#ifndef FASTDEPLOY_BLOCKS_INT8_H
#define FASTDEPLOY_BLOCKS_INT8_H

#include "blocks.h"

#define FEW_ROWS 4 /* up to this many rows the panels are read straight (gemm_blocks_int8_rows.c) */

enum { MODE_AVX2 = 0, MODE_AVX_VNNI = 1, MODE_AVX512_VNNI = 2 }; /* fd_int8_dots' numbers */

/* The activations of one product, quantised, [rows padded to a whole number of tiles]. */
struct int8_acts {
    const int8_t *q;      /* [rows, depth] */
    const float *scale;   /* [rows, depth / 32]: sx */
    const int32_t *init;  /* [rows, depth / sub]: each sub-block's dot starts at -(weight offset) sum qx */
    const float *sum;     /* [rows, depth / sub]: each sub-block's sum qx */
};

/* The weight offset the few-row kernels of sub-block `kind` add (their `init`), in dot `mode`. */
int blocks_int8_rows_offset(int kind, int mode);
/* Whether the AVX-512 few-row kernels transpose with AVX512_VBMI's vpermb (where the CPU has it), after
 * `allow` (0 or 1: the tests' switch to the fallback; -1 leaves it). */
int blocks_int8_rows_vbmi(int allow);
/* Rows 0 .. a->rows - 1 (at most FEW_ROWS, x padded with zero rows to FEW_ROWS) of sub-block `kind`
 * (not MXFP4) times its panels, with the dots of `mode`, on `threads`. */
void blocks_int8_rows(const struct gemm_args *a, const struct int8_acts *x, int kind, int mode, int threads);

#endif
