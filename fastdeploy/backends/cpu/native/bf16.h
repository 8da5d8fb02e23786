/*
 * bfloat16 rounding shared by the bfloat16 kernels (gemm_bf16.c, encoder_attention_bf16.c), so weights,
 * activations, keys, values and probabilities are all rounded alike.
 */
#ifndef FASTDEPLOY_BF16_H
#define FASTDEPLOY_BF16_H

#include <stdint.h>
#include <string.h>

/* float32 bits -> bfloat16 bits, rounded to nearest even; NaN quieted (rounding could make it inf). */
static inline uint16_t bf16_bits(uint32_t bits)
{
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)((bits & 0x7FFFFFFFu) > 0x7F800000u ? (bits >> 16) | 0x0040u : rounded);
}

static inline uint16_t bf16_of(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    return bf16_bits(bits);
}

#endif
