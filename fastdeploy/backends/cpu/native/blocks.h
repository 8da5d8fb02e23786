/*
 * The sub-block panel layout: every GGUF block type but Q4_1/Q8_0 (gemm.c's own), repacked once at
 * load (block_packing.c) into one layout that the kernels of gemm_blocks.h read.
 *
 * Every one of these types stores, per weight, a small integer q and, per sub-block of S = 16 or 32
 * consecutive k, a scale (and for some types a minimum), from which gguf dequantises
 *     w = scale * (q - offset)            (Q4_0, Q5_0, Q3_K, Q6_K; IQ4_*: scale * codebook[q])
 *     w = scale * q - minimum             (Q5_1, Q2_K, Q4_K, Q5_K; Q5_1 adds its minimum)
 * with the scale (and minimum) a product of float16 super-block factors and small integer
 * sub-block factors, each exact in float32. The repacking computes those effective scales and
 * minimums once per (column, sub-block) as float32 (minimums with the sign gguf applies), so the
 * kernels fold whole sub-block sums as gemm.c does for Q4_1:
 *     total = fma(scale, x.q, total);  then, with a minimum:  total = fma(minimum, sum of x, total)
 * which gives, for an identity input, exactly gguf's float32 value (one rounding, as gguf's).
 *
 * A panel group covers 32 k of 16 output columns (one GGUF block of the 32-weight types, an eighth
 * of a 256-weight super-block), in this order:
 *   scales   float32 [32 / S][16]
 *   minimums float32 [32 / S][16]              (types with a minimum only)
 *   nibbles  16 rows j of 16 bytes: byte n = q[2j][n] | q[2j + 1][n] << 4    (types of 4 bits or fewer)
 *   or bytes 32 rows k of 16 int8: q[k][n] - offset                           (5- and 6-bit types)
 * The integer of (k, column n) is the nibble minus the type's offset or through its 16-entry codebook,
 * or the byte: on 16 bytes at once (one k of the 16 columns), then widened. The 5- and 6-bit types
 * take a byte per weight rather than a nibble and bit planes: one-row products are short of
 * arithmetic, not bandwidth, and decoding planes cost 3 operations per plane and k (measured: a
 * Q6_K one-row product took 2.9x Q8_0's time with two planes).
 * A panel's groups follow each other along k, panels along n; columns past the matrix are zero.
 */
#ifndef FASTDEPLOY_BLOCKS_H
#define FASTDEPLOY_BLOCKS_H

#include "native.h"

#define GROUP 32 /* k per panel group */

static inline int is_subblock_kind(int kind) { return (kind >= KIND_Q4_0 && kind <= KIND_IQ4_XS) || kind == KIND_MXFP4; }

/* k per sub-block (one scale and minimum) */
static inline __attribute__((always_inline)) int block_sub(int kind)
{
    return kind == KIND_Q2_K || kind == KIND_Q3_K || kind == KIND_Q6_K ? 16 : 32;
}

static inline __attribute__((always_inline)) int block_has_min(int kind)
{
    return kind == KIND_Q5_1 || kind == KIND_Q2_K || kind == KIND_Q4_K || kind == KIND_Q5_K;
}

/* whether the integers are stored as bytes (offset applied) rather than nibbles */
static inline __attribute__((always_inline)) int block_bytewise(int kind)
{
    return kind == KIND_Q6_K || kind == KIND_Q5_0 || kind == KIND_Q5_1 || kind == KIND_Q5_K;
}

/* what is subtracted from gguf's integer (by the kernels for nibbles, by the packing for bytes) */
static inline __attribute__((always_inline)) int block_offset(int kind)
{
    switch (kind) {
    case KIND_Q4_0: return 8;
    case KIND_Q5_0: return 16;
    case KIND_Q3_K: return 4;
    case KIND_Q6_K: return 32;
    default: return 0;
    }
}

/* whether the stored nibble indexes the IQ4 codebook */
static inline __attribute__((always_inline)) int block_codebook(int kind)
{
    return kind == KIND_IQ4_NL || kind == KIND_IQ4_XS || kind == KIND_MXFP4;
}

/* IQ4_NL's and IQ4_XS's codebook (gguf's kvalues) */
static const int8_t IQ4_CODEBOOK[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* MXFP4's: the FP4 (e2m1) values doubled, as gguf stores them (its scale is halved to match) */
static const int8_t MXFP4_CODEBOOK[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* the codebook of a kind with one */
static inline __attribute__((always_inline)) const int8_t *block_codebook_values(int kind)
{
    return kind == KIND_MXFP4 ? MXFP4_CODEBOOK : IQ4_CODEBOOK;
}

/* byte offsets inside a group and its size */
static inline __attribute__((always_inline)) Py_ssize_t group_min_offset(int kind)
{
    return (GROUP / block_sub(kind)) * PANEL * 4;
}
static inline __attribute__((always_inline)) Py_ssize_t group_nibble_offset(int kind)
{
    return group_min_offset(kind) * (1 + block_has_min(kind));
}
static inline __attribute__((always_inline)) Py_ssize_t group_bytes(int kind)
{
    return group_nibble_offset(kind) + PANEL * GROUP / (block_bytewise(kind) ? 1 : 2);
}

#endif
