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
 *   nibbles  16 rows j of 16 bytes: byte n = low 4 bits of q[2j][n] | of q[2j + 1][n] << 4
 *   planes   PLANES x 4 rows of 16 bytes: plane p, row k / 8, byte n, bit k % 8 = bit 4 + p of q[k][n]
 * The integer of (k, column n) is the nibble, the plane bits above it, then minus the type's offset
 * or through its 16-entry codebook: all on 16 bytes at once (one k of the 16 columns), then widened.
 * A panel's groups follow each other along k, panels along n; columns past the matrix are zero.
 */
#ifndef FASTDEPLOY_BLOCKS_H
#define FASTDEPLOY_BLOCKS_H

#include "native.h"

#define GROUP 32 /* k per panel group */

static inline int is_subblock_kind(int kind) { return kind >= KIND_Q4_0 && kind <= KIND_IQ4_XS; }

/* k per sub-block (one scale and minimum) */
static inline __attribute__((always_inline)) int block_sub(int kind)
{
    return kind == KIND_Q2_K || kind == KIND_Q3_K || kind == KIND_Q6_K ? 16 : 32;
}

static inline __attribute__((always_inline)) int block_has_min(int kind)
{
    return kind == KIND_Q5_1 || kind == KIND_Q2_K || kind == KIND_Q4_K || kind == KIND_Q5_K;
}

/* bit planes above the nibble */
static inline __attribute__((always_inline)) int block_planes(int kind)
{
    return kind == KIND_Q6_K ? 2 : (kind == KIND_Q5_0 || kind == KIND_Q5_1 || kind == KIND_Q5_K) ? 1 : 0;
}

/* what is subtracted from the stored integer */
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
    return kind == KIND_IQ4_NL || kind == KIND_IQ4_XS;
}

/* IQ4_NL's and IQ4_XS's codebook (gguf's kvalues) */
static const int8_t IQ4_CODEBOOK[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* byte offsets inside a group and its size */
static inline __attribute__((always_inline)) Py_ssize_t group_min_offset(int kind)
{
    return (GROUP / block_sub(kind)) * PANEL * 4;
}
static inline __attribute__((always_inline)) Py_ssize_t group_nibble_offset(int kind)
{
    return group_min_offset(kind) * (1 + block_has_min(kind));
}
static inline __attribute__((always_inline)) Py_ssize_t group_plane_offset(int kind)
{
    return group_nibble_offset(kind) + PANEL * GROUP / 2;
}
static inline __attribute__((always_inline)) Py_ssize_t group_bytes(int kind)
{
    return group_plane_offset(kind) + block_planes(kind) * PANEL * GROUP / 8;
}

#endif
