/*
 * Fused weights whose parts are of different kinds (KIND_MIXED): a fused q/k/v projection of a
 * Q4_K_M file is Q4_K for q and k and Q6_K for v in some layers. Each part keeps its own kind and
 * packed layout (a segment of whole output columns), so no part is dequantised to float32.
 *
 * Layout: a header of MIXED_HEADER_BYTES, int64 count then (kind, cols, byte offset) per segment,
 * then each segment's packed bytes at its offset (64-byte aligned), in column order. A product runs
 * each segment's kernel into a scratch [rows, segment cols] and copies the columns into place: the
 * arithmetic of a row is the segment kernel's, so batch invariance and exactness carry over.
 */
#include "native.h"

#include <string.h>

static const int64_t *mixed_header(const uint8_t *packed) { return (const int64_t *)packed; }

int fd_packed_valid(int kind, const uint8_t *packed, Py_ssize_t len, Py_ssize_t cols, Py_ssize_t depth)
{
    if (kind < KIND_Q4_1 || kind >= KINDS) return 0;
    if (kind != KIND_MIXED) return len == fd_packed_bytes(kind, cols, depth);
    if (len < MIXED_HEADER_BYTES) return 0;
    const int64_t *h = mixed_header(packed);
    if (h[0] < 1 || h[0] > MIXED_MAX_SEGMENTS) return 0;
    Py_ssize_t total = 0, end = MIXED_HEADER_BYTES;
    for (int64_t s = 0; s < h[0]; s++) {
        const int64_t seg_kind = h[1 + 3 * s], seg_cols = h[2 + 3 * s], offset = h[3 + 3 * s];
        if (seg_kind < KIND_Q4_1 || seg_kind >= KINDS || seg_kind == KIND_MIXED || seg_cols <= 0 || offset < end ||
            offset % 64 != 0)
            return 0;
        end = offset + fd_packed_bytes((int)seg_kind, seg_cols, depth);
        if (end > len) return 0;
        total += seg_cols;
    }
    return total == cols;
}

int gemm_mixed(const struct gemm_args *a, int isa, int threads)
{
    const int64_t *h = mixed_header(a->packed);
    Py_ssize_t widest = 0;
    for (int64_t s = 0; s < h[0]; s++) widest = h[2 + 3 * s] > widest ? h[2 + 3 * s] : widest;
    float *scratch = PyMem_RawMalloc((size_t)(a->rows * widest) * sizeof(float));
    if (scratch == NULL) return -1;
    Py_ssize_t col0 = 0;
    for (int64_t s = 0; s < h[0]; s++) {
        const Py_ssize_t cols = h[2 + 3 * s];
        const struct gemm_args part = {a->x, a->packed + h[3 + 3 * s], scratch, a->rows, cols, a->depth, (int)h[1 + 3 * s],
                                       a->bias ? a->bias + col0 : NULL};
        if (fd_gemm(&part, isa, threads)) {
            PyMem_RawFree(scratch);
            return -1;
        }
        for (Py_ssize_t r = 0; r < a->rows; r++)
            memcpy(a->out + r * a->cols + col0, scratch + r * cols, (size_t)cols * sizeof(float));
        col0 += cols;
    }
    PyMem_RawFree(scratch);
    return 0;
}
