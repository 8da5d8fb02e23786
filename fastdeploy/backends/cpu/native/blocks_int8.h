/*
 * What the int8-activation products of the sub-block kinds (gemm_blocks_int8.c) share with their
 * one- to FEW_ROWS-row kernels (gemm_blocks_int8_rows.c): the quantised activations and the dots.
 */
#ifndef FASTDEPLOY_BLOCKS_INT8_H
#define FASTDEPLOY_BLOCKS_INT8_H

#include "blocks.h"

#include <immintrin.h>
#include <string.h>

#define FEW_ROWS 4 /* up to this many rows the panels are read straight (gemm_blocks_int8_rows.c) */

enum { MODE_AVX2 = 0, MODE_AVX_VNNI = 1, MODE_AVX512_VNNI = 2 }; /* fd_int8_dots' numbers */

/* The activations of one product, quantised, [rows padded to a whole number of tiles]. */
struct int8_acts {
    const int8_t *q;      /* [rows, depth] */
    const float *scale;   /* [rows, depth / 32]: sx */
    const int32_t *init;  /* [rows, depth / sub]: each sub-block's dot starts at -(weight offset) sum qx */
    const float *sum;     /* [rows, depth / sub]: each sub-block's sum qx */
};

/* how far ahead the few-row kernels (here and gemm_int8.c's) prefetch, rounded to whole blocks: they
 * read each weight once, and a decode token's weights stream from memory; 4 groups read Q4_K 1.25x
 * slower than 16 (6 KB) on matrices that do not stay in cache, Q6_K best at 8-16 groups (4.5-9 KB) */
#define PREFETCH_BYTES 6144

/* Prefetches the block of `bytes` PREFETCH_BYTES (in whole blocks) after `blk`. */
static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *blk, Py_ssize_t bytes)
{
    const uint8_t *ahead = blk + PREFETCH_BYTES / bytes * bytes;
    for (Py_ssize_t line = 0; line < bytes; line += 64) _mm_prefetch((const char *)ahead + line, _MM_HINT_T0);
}

/* the 4 activation bytes a dot instruction broadcasts, as one 32-bit lane */
static inline __attribute__((always_inline)) int32_t four_bytes(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* dot += the unsigned bytes of w times the signed ones of x, 4 at a time: AVX-VNNI's vpdpbusd (the AVX2
 * kernels on CPUs with AVX-VNNI), written out (VEX encoded) because its intrinsic cannot be inlined
 * into code that also runs without it */
static inline __attribute__((always_inline, target("avx2"))) __m256i avx_vnni_dot(__m256i dot, __m256i w, __m256i xv)
{
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(dot) : "x"(w), "x"(xv));
    return dot;
}

/* The weight offset the few-row kernels of sub-block `kind` add (their `init`), in dot `mode`. */
int blocks_int8_rows_offset(int kind, int mode);
/* Whether the AVX-512 few-row kernels transpose with AVX512_VBMI's vpermb (where the CPU has it), after
 * `allow` (0 or 1: the tests' switch to the fallback; -1 leaves it). */
int blocks_int8_rows_vbmi(int allow);
/* Rows 0 .. a->rows - 1 (at most FEW_ROWS, x padded with zero rows to FEW_ROWS) of sub-block `kind`
 * (not MXFP4) times its panels, with the dots of `mode`, on `threads`. */
void blocks_int8_rows(const struct gemm_args *a, const struct int8_acts *x, int kind, int mode, int threads);

#endif
