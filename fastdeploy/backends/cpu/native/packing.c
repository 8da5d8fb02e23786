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
 * Why C: this runs once per weight at every start, and the numpy version's reshapes, nibble
 * splits and concatenations took ~0.3 s of CPU for SmolLM2 (of a 1.5 s start-up budget).
 */
#include "native.h"

#include <string.h>

#define QBLOCK 32
#define Q4_1_BLOCK_BYTES 20
#define Q8_0_BLOCK_BYTES 34

static void pack_q4_1_block(uint8_t *dst, const uint8_t *const src[PANEL])
{
    memset(dst, 0, PANEL * 4 + PANEL * QBLOCK / 2);
    for (int n = 0; n < PANEL; n++) {
        if (src[n] == NULL) continue;
        memcpy(dst + 2 * n, src[n], 2);                 /* d */
        memcpy(dst + 2 * PANEL + 2 * n, src[n] + 2, 2); /* m */
        const uint8_t *qs = src[n] + 4;
        for (int j = 0; j < QBLOCK / 2; j++) {
            const int k0 = 2 * j, k1 = 2 * j + 1;
            const uint8_t q0 = k0 < 16 ? qs[k0] & 0x0F : qs[k0 - 16] >> 4;
            const uint8_t q1 = k1 < 16 ? qs[k1] & 0x0F : qs[k1 - 16] >> 4;
            dst[4 * PANEL + PANEL * j + n] = (uint8_t)(q0 | q1 << 4);
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
    const Py_ssize_t blocks = in_features / QBLOCK, panels = (out_features + PANEL - 1) / PANEL;
    const Py_ssize_t src_bytes = kind == KIND_Q4_1 ? Q4_1_BLOCK_BYTES : Q8_0_BLOCK_BYTES;
    const Py_ssize_t dst_bytes = kind == KIND_Q4_1 ? PANEL * 4 + PANEL * QBLOCK / 2 : PANEL * 2 + PANEL * QBLOCK;
    if (kind != KIND_Q4_1 && kind != KIND_Q8_0) {
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
                uint8_t *block = dst + (p * blocks + b) * dst_bytes;
                if (kind == KIND_Q4_1)
                    pack_q4_1_block(block, column_blocks);
                else
                    pack_q8_0_block(block, column_blocks);
            }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&rows);
    PyBuffer_Release(&out);
    return result;
}
