/*
 * Repacks GGUF Q4_1 / Q8_0 rows into the column panels the matmul kernels stream (layout: gemm.c).
 *
 * A GGUF matrix is [out, in] rows of 32-weight blocks, each with its own float16 scale (and minimum
 * for Q4_1): Q4_1 block = d, m, 16 bytes of which byte i holds quant i (low nibble) and quant i + 16
 * (high nibble); Q8_0 block = d, 32 int8. The kernels produce 16 output columns at a time, so the
 * blocks of 16 consecutive rows are interleaved: for one block index, the 16 rows' scales sit
 * together and the quants are stored k-major, one 16-byte row per k (Q8_0) or per pair of k's
 * (Q4_1: k = 2j in the low nibbles, 2j + 1 in the high ones). Rows past `out` are zero blocks.
 *
 * The int8-activation kernels (gemm_int8.c) read the same blocks in layouts made for integer dot
 * products, where a 64-byte vector holds 4 consecutive k's of each of the 16 columns (byte 4n + i =
 * column n, k0 + i), the order `vpdpbusd` / `vpmaddubsw` sum in:
 *   KIND_Q8_0_I8 block: d[16] fp16, then 8 groups g of 64 bytes: q[4g + i][n] + 128 (unsigned)
 *   KIND_Q4_1_I8 block: d[16] fp16, m[16] fp16, then 4 chunks c of 64 bytes whose low nibbles are
 *                       k = 8c + i and high nibbles k = 8c + 4 + i
 *
 * Why C: this runs once per weight at every start, and the numpy version's reshapes, nibble
 * splits and concatenations took ~0.3 s of CPU for SmolLM2 (of a 1.5 s start-up budget).
 */
#include "native.h"

#include <string.h>

#define QBLOCK 32
#define Q4_1_BLOCK_BYTES 20
#define Q8_0_BLOCK_BYTES 34

/* quant k (0..31) of a GGUF Q4_1 block's 16 bytes: byte i holds quants i and i + 16 */
static inline uint8_t q4_1_quant(const uint8_t *qs, int k) { return k < 16 ? qs[k] & 0x0F : qs[k - 16] >> 4; }

static void pack_q4_1_block(uint8_t *dst, const uint8_t *const src[PANEL])
{
    memset(dst, 0, PANEL * 4 + PANEL * QBLOCK / 2);
    for (int n = 0; n < PANEL; n++) {
        if (src[n] == NULL) continue;
        memcpy(dst + 2 * n, src[n], 2);                 /* d */
        memcpy(dst + 2 * PANEL + 2 * n, src[n] + 2, 2); /* m */
        const uint8_t *qs = src[n] + 4;
        for (int j = 0; j < QBLOCK / 2; j++)
            dst[4 * PANEL + PANEL * j + n] = (uint8_t)(q4_1_quant(qs, 2 * j) | q4_1_quant(qs, 2 * j + 1) << 4);
    }
}

static void pack_q4_1_i8_block(uint8_t *dst, const uint8_t *const src[PANEL])
{
    memset(dst, 0, PANEL * 4 + PANEL * QBLOCK / 2);
    for (int n = 0; n < PANEL; n++) {
        if (src[n] == NULL) continue;
        memcpy(dst + 2 * n, src[n], 2);
        memcpy(dst + 2 * PANEL + 2 * n, src[n] + 2, 2);
        const uint8_t *qs = src[n] + 4;
        for (int c = 0; c < 4; c++)
            for (int i = 0; i < 4; i++)
                dst[4 * PANEL + 64 * c + 4 * n + i] =
                    (uint8_t)(q4_1_quant(qs, 8 * c + i) | q4_1_quant(qs, 8 * c + 4 + i) << 4);
    }
}

static void pack_q8_0_i8_block(uint8_t *dst, const uint8_t *const src[PANEL])
{
    memset(dst, 0, PANEL * 2);
    memset(dst + PANEL * 2, 128, PANEL * QBLOCK); /* a zero weight, biased */
    for (int n = 0; n < PANEL; n++) {
        if (src[n] == NULL) continue;
        memcpy(dst + 2 * n, src[n], 2);
        for (int k = 0; k < QBLOCK; k++) {
            /* -128 (never written by llama.cpp's quantiser) becomes -127, so that AVX2's sign trick
             * (gemm_int8.c) cannot overflow */
            const int8_t w = (int8_t)src[n][2 + k];
            dst[2 * PANEL + 64 * (k / 4) + 4 * n + k % 4] = (uint8_t)((w < -127 ? -127 : w) + 128);
        }
    }
}

static void pack_q8_0_block(uint8_t *dst, const uint8_t *const src[PANEL])
{
    memset(dst, 0, PANEL * 2 + PANEL * QBLOCK);
    for (int n = 0; n < PANEL; n++) {
        if (src[n] == NULL) continue;
        memcpy(dst + 2 * n, src[n], 2);
        for (int k = 0; k < QBLOCK; k++) dst[2 * PANEL + PANEL * k + n] = src[n][2 + k];
    }
}

/* pack_blocks(kind, rows, out, out_features, in_features): rows [out_features, in/32 * block bytes] */
PyObject *native_pack_blocks(PyObject *self, PyObject *args)
{
    int kind;
    Py_buffer rows, out;
    Py_ssize_t out_features, in_features;
    if (!PyArg_ParseTuple(args, "iy*w*nn", &kind, &rows, &out, &out_features, &in_features)) return NULL;
    PyObject *result = NULL;
    if (kind >= KIND_Q4_0 && kind <= KIND_MXFP4) { /* the sub-block kinds: block_packing.c */
        int failed;
        Py_BEGIN_ALLOW_THREADS
        failed = pack_subblock_rows(subblock_layout(kind), rows.buf, rows.len, out.buf, out.len, out_features, in_features);
        Py_END_ALLOW_THREADS
        if (failed == -2)
            PyErr_NoMemory();
        else if (failed)
            PyErr_SetString(PyExc_ValueError, "pack_blocks: buffer sizes do not match the shape");
        else
            result = Py_NewRef(Py_None);
        PyBuffer_Release(&rows);
        PyBuffer_Release(&out);
        return result;
    }
    const Py_ssize_t blocks = in_features / QBLOCK, panels = (out_features + PANEL - 1) / PANEL;
    const int q4_1 = kind == KIND_Q4_1 || kind == KIND_Q4_1_I8;
    const Py_ssize_t src_bytes = q4_1 ? Q4_1_BLOCK_BYTES : Q8_0_BLOCK_BYTES;
    const Py_ssize_t dst_bytes = q4_1 ? PANEL * 4 + PANEL * QBLOCK / 2 : PANEL * 2 + PANEL * QBLOCK;
    void (*pack_block)(uint8_t *, const uint8_t *const[PANEL]) =
        kind == KIND_Q4_1 ? pack_q4_1_block : kind == KIND_Q8_0 ? pack_q8_0_block
        : kind == KIND_Q4_1_I8 ? pack_q4_1_i8_block : kind == KIND_Q8_0_I8 ? pack_q8_0_i8_block : NULL;
    if (pack_block == NULL) {
        PyErr_Format(PyExc_ValueError, "pack_blocks: unknown block kind %d", kind);
    } else if (out_features <= 0 || in_features <= 0 || in_features % QBLOCK != 0 ||
               rows.len != out_features * blocks * src_bytes || out.len != panels * blocks * dst_bytes) {
        PyErr_SetString(PyExc_ValueError, "pack_blocks: buffer sizes do not match the shape");
    } else {
        const uint8_t *src = rows.buf;
        uint8_t *dst = out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < panels; p++)
            for (Py_ssize_t b = 0; b < blocks; b++) {
                const uint8_t *column_blocks[PANEL];
                for (int n = 0; n < PANEL; n++) {
                    const Py_ssize_t row = p * PANEL + n;
                    column_blocks[n] = row < out_features ? src + (row * blocks + b) * src_bytes : NULL;
                }
                pack_block(dst + (p * blocks + b) * dst_bytes, column_blocks);
            }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&rows);
    PyBuffer_Release(&out);
    return result;
}

/* packed_bytes(kind, out_features, in_features) */
PyObject *native_packed_bytes(PyObject *self, PyObject *args)
{
    int kind;
    Py_ssize_t out_features, in_features;
    if (!PyArg_ParseTuple(args, "inn", &kind, &out_features, &in_features)) return NULL;
    if (kind < KIND_Q4_1 || kind >= KINDS || kind == KIND_MIXED || out_features <= 0 || in_features <= 0) {
        PyErr_Format(PyExc_ValueError, "packed_bytes: no weight of kind %d and shape [%zd, %zd]", kind, out_features,
                     in_features);
        return NULL;
    }
    return PyLong_FromSsize_t(fd_packed_bytes(kind, out_features, in_features));
}
