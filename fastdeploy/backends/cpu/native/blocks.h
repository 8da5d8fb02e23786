/*
 * The sub-block panel layout: every GGUF block type but Q4_1/Q8_0 (gemm.c's own), repacked once at
 * load (block_packing.c) into one layout that the kernels of gemm_blocks.h read.
 *
 * Every one of these types stores, per weight, a small integer q and, per sub-block of S = 16 or 32
 * consecutive k, a scale (and for some types a minimum), from which gguf dequantises
 *     w = scale * (q - offset)            (Q4_0, Q5_0, Q3_K, Q6_K; IQ4_*: scale * codebook[q])
 *     w = scale * q - minimum             (Q5_1, Q2_K, Q4_K, Q5_K; Q5_1 adds its minimum)
 * with the scale (and minimum) a float16 factor d (dmin) times, for the K-quants and IQ4_XS, a small
 * integer sub-block factor sc (m), each exact in float32, and so is their float32 product (the same
 * single multiply gguf performs). The kernels compute those effective scales and minimums (minimums
 * with the sign gguf applies) per group from the stored factors (block_quants.h: group_factors),
 * and fold whole sub-block sums as gemm.c does for Q4_1:
 *     total = fma(scale, x.q, total);  then, with a minimum:  total = fma(minimum, sum of x, total)
 * which gives, for an identity input, exactly gguf's float32 value (one rounding, as gguf's).
 *
 * A panel group covers 32 k of 16 output columns (one GGUF block of the 32-weight types, an eighth
 * of a 256-weight super-block), in this order:
 *   d        float16 [16]                      (MXFP4: its scales as float32 [16] instead)
 *   dmin     float16 [16]                      (types with a minimum; Q5_1: the minimum itself)
 *   sc       int8 [32 / S][16]                 (K-quants and IQ4_XS: sub-block scale factors)
 *   m        int8 [32 / S][16]                 (Q2_K, Q4_K, Q5_K: sub-block minimum factors)
 *   nibbles  4 chunks c of 64 bytes: byte 16 i + n = q[8c + i][n] & 15 | (q[8c + 4 + i][n] & 15) << 4, i < 4
 *   plane    the 5-bit types: 64 bytes, bit s of byte j = bit 4 of q[4s + j / 16][j % 16]
 *            Q6_K_NIBBLES (Q6_K's int8 twin): 128 bytes, bits 2i, 2i + 1 of byte 64 h + j = bits 4, 5
 *            of q[4 (4h + i) + j / 16][j % 16] (block_high_bits: steps s of 4 k per 64 bytes, each
 *            its b bits at b (s % (8 / b)) of chunk s / (8 / b))
 *   or bytes Q6_K: 32 rows k of 16 int8, q[k][n] - 32
 * with q gguf's unsigned integer. The kernels decode a whole group at once (block_quants.h:
 * group_ints) into 512 int8 [32 k][16 columns], the integer of (k, n) at 16 k + n after the type's
 * offset or through its 16-entry codebook: a 64-byte chunk of nibbles is its low nibbles (k 8c ..
 * 8c + 3) and its high ones (the next 4), the plane's bits land on the same lanes, so each 64 (AVX2:
 * 32) decoded bytes cost a few full-width operations, after which the products read 16 bytes per k
 * (Q6_K's bytes are read where they lie).
 * Why: the 5- and 6-bit types were bytes and every type kept float32 scales and minimums (Q6_K and
 * Q5_* took 10 bits a weight, up to 1.8x the GGUF block), and the integers were decoded one k of 16
 * bytes at a time, where bit planes cost 3 operations per plane and k. A one-row product (decode)
 * reads each weight once: its time is the larger of its bytes at the memory's rate and its vector
 * operations, 3 per 16 weights to widen, convert and multiply, plus the decode. Decoded by whole
 * groups, Q5's plane costs about 3 operations per 64 weights and the factors a few per group; Q6_K's
 * 2-bit plane cost about 4.25 per 64 (AVX2: twice that), and bytes measured 1.01-1.07x its speed
 * with AVX-512 and 1.17x with AVX2 (two threads, ERNIE-shaped layers), so Q6_K keeps bytes for them.
 * The int8 kernels decode in registers straight into their dots' order, where the high bits cost
 * 2 operations per 64 weights (AVX-512) beside dots that are cheap, and a one-row product streams at
 * the memory's rate: for them Q6_K's integers are nibbles and their two high bits (KIND_Q6_K_NIBBLES,
 * 7 bits a weight). Bits per weight: Q4_0 and IQ4_NL 4.5, Q5_0 5.5, Q5_1 6 (as GGUF), Q4_K 5.5, Q5_K 6.5,
 * Q6_K 9 (KIND_Q6_K_NIBBLES 7), IQ4_XS 4.75.
 * A panel's groups follow each other along k, panels along n; columns past the matrix are zero.
 */
#ifndef FASTDEPLOY_BLOCKS_H
#define FASTDEPLOY_BLOCKS_H

#include "native.h"

#define GROUP 32 /* k per panel group */

static inline int is_subblock_kind(int kind)
{
    return (kind >= KIND_Q4_0 && kind <= KIND_IQ4_XS) || kind == KIND_MXFP4 || kind == KIND_Q6_K_NIBBLES;
}

/* the GGUF type whose blocks a layout holds (KIND_Q6_K_NIBBLES: Q6_K's) */
static inline __attribute__((always_inline)) int block_gguf_kind(int layout)
{
    return layout == KIND_Q6_K_NIBBLES ? KIND_Q6_K : layout;
}

/* k per sub-block (one scale and minimum) */
static inline __attribute__((always_inline)) int block_sub(int kind)
{
    return kind == KIND_Q2_K || kind == KIND_Q3_K || kind == KIND_Q6_K || kind == KIND_Q6_K_NIBBLES ? 16 : 32;
}

static inline __attribute__((always_inline)) int block_has_min(int kind)
{
    return kind == KIND_Q5_1 || kind == KIND_Q2_K || kind == KIND_Q4_K || kind == KIND_Q5_K;
}

/* the integers' bits above the nibble, kept in a plane beside the nibbles: the 5-bit types' fifth,
 * Q6_K_NIBBLES' fifth and sixth */
static inline __attribute__((always_inline)) int block_high_bits(int kind)
{
    return kind == KIND_Q5_0 || kind == KIND_Q5_1 || kind == KIND_Q5_K ? 1 : kind == KIND_Q6_K_NIBBLES ? 2 : 0;
}

/* Where step s's (k 4s .. 4s + 3) high bits lie in the plane: its 64-byte chunk, and the left shift (negative:
 * right) that puts them at bit 4 of each byte (then masked with high_bits_mask). */
static inline __attribute__((always_inline)) int high_bits_chunk(int kind, int s) { return s / (8 / block_high_bits(kind)); }
static inline __attribute__((always_inline)) int high_bits_shift(int kind, int s)
{
    return 4 - block_high_bits(kind) * (s % (8 / block_high_bits(kind)));
}
static inline __attribute__((always_inline)) int high_bits_mask(int kind) { return ((1 << block_high_bits(kind)) - 1) << 4; }

/* whether the integers are int8 bytes, offset applied, [32 k][16 columns], rather than nibbles (Q6_K) */
static inline __attribute__((always_inline)) int block_bytewise(int kind) { return kind == KIND_Q6_K; }

/* what is subtracted from gguf's integer (by the kernels; by the packing for bytes) */
static inline __attribute__((always_inline)) int block_offset(int kind)
{
    switch (kind) {
    case KIND_Q4_0: return 8;
    case KIND_Q5_0: return 16;
    case KIND_Q3_K: return 4;
    case KIND_Q6_K:
    case KIND_Q6_K_NIBBLES: return 32;
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

/* whether the scales are d times an int8 sub-block factor (and the minimums -(dmin times one)) */
static inline __attribute__((always_inline)) int block_factor_ints(int kind)
{
    return kind == KIND_Q2_K || kind == KIND_Q3_K || kind == KIND_Q4_K || kind == KIND_Q5_K || kind == KIND_Q6_K ||
           kind == KIND_Q6_K_NIBBLES || kind == KIND_IQ4_XS;
}

/* byte offsets inside a group and its size */
static inline __attribute__((always_inline)) Py_ssize_t group_dmin_offset(int kind)
{
    return kind == KIND_MXFP4 ? PANEL * 4 : PANEL * 2;
}
static inline __attribute__((always_inline)) Py_ssize_t group_sc_offset(int kind)
{
    return group_dmin_offset(kind) + PANEL * 2 * block_has_min(kind);
}
static inline __attribute__((always_inline)) Py_ssize_t group_m_offset(int kind)
{
    return group_sc_offset(kind) + (block_factor_ints(kind) ? GROUP / block_sub(kind) * PANEL : 0);
}
static inline __attribute__((always_inline)) Py_ssize_t group_nibble_offset(int kind)
{
    return group_m_offset(kind) + (block_factor_ints(kind) && block_has_min(kind) ? GROUP / block_sub(kind) * PANEL : 0);
}
static inline __attribute__((always_inline)) Py_ssize_t group_plane_offset(int kind)
{
    return group_nibble_offset(kind) + PANEL * GROUP / (block_bytewise(kind) ? 1 : 2);
}
static inline __attribute__((always_inline)) Py_ssize_t group_bytes(int kind)
{
    return group_plane_offset(kind) + PANEL * GROUP / 8 * block_high_bits(kind);
}

#endif
