/*
 * GGUF rows of the sub-block kinds repacked into blocks.h's panels, once at load.
 *
 * Each GGUF block (32 weights, or a 256-weight super-block) is decoded into its integers (as the
 * layout stores them: gguf's unsigned integers, before the offset or codebook) and its factors as
 * gguf stores them: the float16 d (and dmin) of the block and, for the K-quants and IQ4_XS, each
 * sub-block's integer factors, whose products with d the kernels form as gguf-py's `gguf.quants`
 * dequantisers do (tests check the products bit for bit). A matrix row is decoded whole, then
 * scattered into its column of every panel group.
 */
#include "blocks.h"

#include <string.h>

/* weights per GGUF block and its bytes */
static int gguf_block_weights(int kind)
{
    return kind == KIND_Q4_0 || kind == KIND_Q5_0 || kind == KIND_Q5_1 || kind == KIND_IQ4_NL || kind == KIND_MXFP4 ? 32 : 256;
}

static Py_ssize_t gguf_block_bytes(int kind)
{
    switch (kind) {
    case KIND_Q4_0: return 18;
    case KIND_Q5_0: return 22;
    case KIND_Q5_1: return 24;
    case KIND_Q2_K: return 84;
    case KIND_Q3_K: return 110;
    case KIND_Q4_K: return 144;
    case KIND_Q5_K: return 176;
    case KIND_Q6_K: return 210;
    case KIND_IQ4_NL: return 18;
    case KIND_IQ4_XS: return 136;
    case KIND_MXFP4: return 17;
    default: return 0;
    }
}

/* Q4_K's and Q5_K's 6-bit scale and minimum of sub-block j from their 12 packed bytes */
static void k_scale_min(const uint8_t *s, int j, int *scale, int *min)
{
    if (j < 4) {
        *scale = s[j] & 63;
        *min = s[j + 4] & 63;
    } else {
        *scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
        *min = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
    }
}

/* MXFP4's e8m0 exponent as gguf's halved scale (2^(e - 128), subnormal below e = 2), exact */
static float e8m0_half(uint8_t e)
{
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* A GGUF block's factors: float16 d and dmin (their bits), per sub-block the integer factors sc and m,
 * or for MXFP4 its float32 scale. */
struct block_factors {
    uint16_t d, dmin;
    int8_t sc[16], m[16];
    float scale;
};

static uint16_t half_bits(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* One GGUF block: q[weights] (stored integers) and its factors. */
static void decode_block(int kind, const uint8_t *b, uint8_t *q, struct block_factors *f)
{
    switch (kind) {
    case KIND_Q4_0:
    case KIND_IQ4_NL:
        f->d = half_bits(b);
        for (int i = 0; i < 16; i++) q[i] = b[2 + i] & 0x0F, q[i + 16] = b[2 + i] >> 4;
        return;
    case KIND_Q5_0:
    case KIND_Q5_1: {
        const int with_min = kind == KIND_Q5_1;
        f->d = half_bits(b);
        if (with_min) f->dmin = half_bits(b + 2);
        const uint8_t *qh = b + 2 + 2 * with_min, *qs = qh + 4;
        const uint32_t high = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
        for (int i = 0; i < 16; i++) {
            q[i] = (uint8_t)((qs[i] & 0x0F) | ((high >> i) & 1) << 4);
            q[i + 16] = (uint8_t)((qs[i] >> 4) | ((high >> (i + 16)) & 1) << 4);
        }
        return;
    }
    case KIND_Q2_K: {
        const uint8_t *scales = b, *qs = b + 16;
        f->d = half_bits(b + 80), f->dmin = half_bits(b + 82);
        for (int s = 0; s < 16; s++) f->sc[s] = (int8_t)(scales[s] & 0x0F), f->m[s] = (int8_t)(scales[s] >> 4);
        for (int w = 0; w < 256; w++) {
            const int h = w / 128, shift = (w % 128) / 32, l = w % 32;
            q[w] = (qs[32 * h + l] >> (2 * shift)) & 3;
        }
        return;
    }
    case KIND_Q3_K: {
        const uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
        f->d = half_bits(b + 108);
        for (int j = 0; j < 16; j++) {
            const int low = j < 8 ? sc[j] & 0x0F : sc[j - 8] >> 4, high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
            f->sc[j] = (int8_t)((low | high << 4) - 32);
        }
        for (int w = 0; w < 256; w++) {
            const int h = w / 128, shift = (w % 128) / 32, l = w % 32;
            const int low = (qs[32 * h + l] >> (2 * shift)) & 3, bit = (hmask[w % 32] >> (w / 32)) & 1;
            q[w] = (uint8_t)(low | bit << 2); /* gguf's low - 4 * (1 - bit), plus the offset 4 */
        }
        return;
    }
    case KIND_Q4_K:
    case KIND_Q5_K: {
        f->d = half_bits(b), f->dmin = half_bits(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *qs = kind == KIND_Q4_K ? b + 16 : b + 48;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k_scale_min(scales, j, &sc, &m);
            f->sc[j] = (int8_t)sc, f->m[j] = (int8_t)m;
        }
        for (int w = 0; w < 256; w++) {
            const int c = w / 64, h = (w % 64) / 32, l = w % 32;
            q[w] = (qs[32 * c + l] >> (4 * h)) & 0x0F;
            if (kind == KIND_Q5_K) q[w] |= (uint8_t)(((qh[l] >> (w / 32)) & 1) << 4);
        }
        return;
    }
    case KIND_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128, *scales = b + 192;
        f->d = half_bits(b + 208);
        for (int j = 0; j < 16; j++) f->sc[j] = (int8_t)scales[j];
        for (int w = 0; w < 256; w++) {
            const int h = w / 128, low = (ql[64 * h + w % 64] >> (4 * ((w % 128) / 64))) & 0x0F;
            const int high = (qh[32 * h + w % 32] >> (2 * ((w % 128) / 32))) & 3;
            q[w] = (uint8_t)(low | high << 4);
        }
        return;
    }
    case KIND_MXFP4:
        f->scale = e8m0_half(b[0]);
        for (int i = 0; i < 16; i++) q[i] = b[1 + i] & 0x0F, q[i + 16] = b[1 + i] >> 4;
        return;
    case KIND_IQ4_XS: {
        f->d = half_bits(b);
        const int scales_h = b[2] | b[3] << 8;
        const uint8_t *scales_l = b + 4, *qs = b + 8;
        for (int j = 0; j < 8; j++) {
            const int ls = ((scales_l[j / 2] >> (4 * (j % 2))) & 0x0F) | ((scales_h >> (2 * j)) & 3) << 4;
            f->sc[j] = (int8_t)(ls - 32);
        }
        for (int w = 0; w < 256; w++) {
            const int c = w / 32, h = (w % 32) / 16, l = w % 16;
            q[w] = (qs[16 * c + l] >> (4 * h)) & 0x0F;
        }
        return;
    }
    }
}

/* Column n of every group of a panel from one decoded matrix row (factors: one per GGUF block). */
static void scatter_row(int kind, uint8_t *panel, int n, const uint8_t *q, const struct block_factors *factors,
                        Py_ssize_t depth)
{
    const int subs = GROUP / block_sub(kind), weights = gguf_block_weights(block_gguf_kind(kind));
    const Py_ssize_t bytes = group_bytes(kind);
    for (Py_ssize_t g = 0; g < depth / GROUP; g++) {
        uint8_t *grp = panel + g * bytes;
        const struct block_factors *f = factors + g * GROUP / weights;
        if (kind == KIND_MXFP4) {
            memcpy(grp + n * 4, &f->scale, 4);
        } else {
            memcpy(grp + n * 2, &f->d, 2);
            if (block_has_min(kind)) memcpy(grp + group_dmin_offset(kind) + n * 2, &f->dmin, 2);
        }
        if (block_factor_ints(kind))
            for (int s = 0; s < subs; s++) {
                const int sub = (int)(g * GROUP % weights) / block_sub(kind) + s; /* sub-block within the GGUF block */
                grp[group_sc_offset(kind) + s * PANEL + n] = (uint8_t)f->sc[sub];
                if (block_has_min(kind)) grp[group_m_offset(kind) + s * PANEL + n] = (uint8_t)f->m[sub];
            }
        const uint8_t *qg = q + g * GROUP;
        uint8_t *nibbles = grp + group_nibble_offset(kind), *plane = grp + group_plane_offset(kind);
        if (block_bytewise(kind)) {
            for (int k = 0; k < GROUP; k++) nibbles[PANEL * k + n] = (uint8_t)(int8_t)(qg[k] - block_offset(kind));
            continue;
        }
        for (int k = 0; k < GROUP; k++) {
            const int at = PANEL * k + n; /* where group_decode puts it: byte at % 64 of step at / 64's chunk */
            nibbles[64 * (k / 8) + PANEL * (k % 4) + n] |= (uint8_t)((qg[k] & 0x0F) << (k % 8 >= 4 ? 4 : 0));
            if (block_high_bits(kind)) {
                const int s = at / 64;
                plane[64 * high_bits_chunk(kind, s) + at % 64] |= (uint8_t)((qg[k] >> 4) << (4 - high_bits_shift(kind, s)));
            }
        }
    }
}

int pack_subblock_rows(int kind, const uint8_t *rows, Py_ssize_t rows_len, uint8_t *out, Py_ssize_t out_len,
                       Py_ssize_t out_features, Py_ssize_t in_features)
{
    const int gguf = block_gguf_kind(kind), weights = gguf_block_weights(gguf);
    const Py_ssize_t row_bytes = in_features / weights * gguf_block_bytes(gguf);
    if (!is_subblock_kind(kind) || out_features <= 0 || in_features <= 0 || in_features % weights != 0 ||
        rows_len != out_features * row_bytes || out_len != fd_packed_bytes(kind, out_features, in_features))
        return -1;
    const Py_ssize_t blocks = in_features / weights;
    uint8_t *q = PyMem_RawMalloc((size_t)in_features);
    struct block_factors *factors = PyMem_RawMalloc((size_t)blocks * sizeof(struct block_factors));
    if (q == NULL || factors == NULL) {
        PyMem_RawFree(q);
        PyMem_RawFree(factors);
        return -2;
    }
    memset(out, 0, (size_t)out_len);
    const Py_ssize_t panel_bytes = in_features / GROUP * group_bytes(kind);
    for (Py_ssize_t row = 0; row < out_features; row++) {
        for (Py_ssize_t b = 0; b < blocks; b++)
            decode_block(gguf, rows + row * row_bytes + b * gguf_block_bytes(gguf), q + b * weights, factors + b);
        scatter_row(kind, out + row / PANEL * panel_bytes, (int)(row % PANEL), q, factors, in_features);
    }
    PyMem_RawFree(q);
    PyMem_RawFree(factors);
    return 0;
}
