/*
 * Matrix products out = x @ W.T in bfloat16 with float32 accumulation (opt-in:
 * FD_CPU_VISION_MATMUL=bfloat16, the vision encoder's linear layers; dtype="bfloat16", every linear
 * layer with float weights: KIND_BF16 through fd_gemm).
 *
 * Why: a vision encoder's linear layers are large products (1024 patch rows for one 448x448 image)
 * bound by arithmetic, and float32 FMAs cap them at ~110 GFLOP/s a core on the Zen 4 these figures
 * come from. AVX512_BF16's `vdpbf16ps` multiplies pairs of bfloat16 values and adds both products to
 * a float32 lane: twice the products per instruction (register-only loops here: 230 against 115
 * GFLOP/s a core for float32 FMAs). The cost is accuracy: weights and activations keep 8
 * significant bits (products are exact in float32 and the sums are float32, so the error is the
 * inputs' rounding, ~2^-9 relative each).
 *
 * Rounding: to nearest even, by one C function for weights (at load: `round_bf16`) and activations
 * (per product, before the tiles run), so both instruction sets multiply the same bfloat16 values.
 * NaN stays NaN (made quiet); infinities stay infinite.
 *
 * Weights, packed once at load (native/__init__.py), as pairs of 16-column panels:
 *   [pairs][k2 = ceil(depth / 2)][32 columns][2]: element [p][j][n][i] = W[32p + n][2j + i]
 * with columns past `cols` and an odd depth's last k padded with zeros. Activations are rounded into
 * [rows][k2][2] (the same k pairs; rows padded apart, `row_stride`), so one 32-bit broadcast of a row's pair (x[2j], x[2j+1]) times
 * one 64-byte weight load gives 16 columns' two products each.
 *
 * Kernels: AVX-512 with AVX512_BF16, tiles of 12 rows x 32 columns (24 accumulators of 32 zmm
 * registers); elsewhere (AVX2, or AVX-512 without BF16) the same packed values widened to float32
 * in registers (a 16-bit shift or a mask) and float32 FMAs, tiles of 4 rows x 16 columns: correct,
 * no faster than float32 (a CPU without BF16 should keep the float32 default). Work is split over
 * pairs of panels, and for a narrow weight (few pairs) over blocks of rows too (threadpool.c), the
 * GIL released. The two kernels' sums differ only in rounding order (vdpbf16ps may also flush
 * denormal products to zero). AMX tiles are not used: some of the VMs this runs in list AMX but
 * fault on its instructions.
 */
#include "native.h"

#include <immintrin.h>
#include <string.h>

#define PAIR_COLS (2 * PANEL)
#define CONVERT_ROWS_PER_TASK 16

/* float32 -> bfloat16 bits, rounded to nearest even; NaN quieted (rounding could make it inf). */
static inline uint16_t bf16_of(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)((bits & 0x7FFFFFFFu) > 0x7F800000u ? (bits >> 16) | 0x0040u : rounded);
}

/* Rounds a run of floats; compiled for AVX-512 too (it runs over every activation of a product),
 * and chosen by the CPU's instruction set (not an ifunc: the build must not need one). */
static inline __attribute__((always_inline)) void round_run(const float *x, uint16_t *out, Py_ssize_t count)
{
#pragma omp simd
    for (Py_ssize_t i = 0; i < count; i++) out[i] = bf16_of(x[i]);
}

static void round_row_any(const float *x, uint16_t *out, Py_ssize_t count) { round_run(x, out, count); }

/* bf16_of on 16 floats a step (the compiler left round_run's select and narrowing scalar: 6% of a
 * bfloat16 prompt pass went to rounding activations), the same bits. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx2"))) static void round_row_avx512(const float *x, uint16_t *out,
                                                                                       Py_ssize_t count)
{
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF);
    const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF), infinity = _mm512_set1_epi32(0x7F800000);
    const __m512i quiet = _mm512_set1_epi32(0x0040);
    Py_ssize_t i = 0;
    for (; i + 16 <= count; i += 16) {
        const __m512i bits = _mm512_loadu_si512(x + i), high = _mm512_srli_epi32(bits, 16);
        __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(half, _mm512_and_si512(high, one))), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, magnitude), infinity);
        rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(high, quiet));
        _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtepi32_epi16(rounded));
    }
    round_run(x + i, out + i, count - i);
}

static void round_row(const float *x, uint16_t *out, Py_ssize_t count)
{
    (native_cpu_isa() == ISA_AVX512 ? round_row_avx512 : round_row_any)(x, out, count);
}

/* The operands of one product: activations already rounded, [rows][x_stride >= k2] 32-bit pairs. */
struct bf16_job {
    const float *x;
    const uint32_t *x_pairs;
    uint16_t *rounded; /* = x_pairs, writable, while the activations are rounded */
    const uint16_t *packed;
    float *out;
    const float *bias;
    Py_ssize_t rows, cols, depth, k2, x_stride, pairs, block_rows;
    int dpbf16;
};

/* ---------------------------------------------------- AVX-512 with BF16 */
#define DPBF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#define DPBF16_ROWS 12

static inline __attribute__((always_inline)) DPBF16_TARGET void
dpbf16_tile(const struct bf16_job *job, const uint16_t *weights, Py_ssize_t row0, int rows, Py_ssize_t col0)
{
    __m512 acc[DPBF16_ROWS * 2];
    for (int i = 0; i < rows * 2; i++) acc[i] = _mm512_setzero_ps();
    const Py_ssize_t k2 = job->k2, x_stride = job->x_stride;
    const int32_t *x = (const int32_t *)job->x_pairs + row0 * x_stride;
    for (Py_ssize_t j = 0; j < k2; j++) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(weights + j * 2 * PAIR_COLS);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(weights + j * 2 * PAIR_COLS + 2 * PANEL);
        for (int r = 0; r < rows; r++) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(x[r * x_stride + j]);
            acc[2 * r] = _mm512_dpbf16_ps(acc[2 * r], xv, w0);
            acc[2 * r + 1] = _mm512_dpbf16_ps(acc[2 * r + 1], xv, w1);
        }
    }
    for (int i = 0; i < 2; i++) {
        const Py_ssize_t start = col0 + i * PANEL;
        if (start >= job->cols) break;
        const Py_ssize_t valid = job->cols - start < PANEL ? job->cols - start : PANEL;
        const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
        const __m512 bias = job->bias ? _mm512_maskz_loadu_ps(mask, job->bias + start) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++)
            _mm512_mask_storeu_ps(job->out + (row0 + r) * job->cols + start, mask, _mm512_add_ps(acc[2 * r + i], bias));
    }
}

#define DPBF16_CASE(n) case n: dpbf16_tile(job, weights, row0, n, col0); break;

static DPBF16_TARGET void dpbf16_pair(const struct bf16_job *job, Py_ssize_t pair, Py_ssize_t first, Py_ssize_t end)
{
    const uint16_t *weights = job->packed + pair * job->k2 * 2 * PAIR_COLS;
    const Py_ssize_t col0 = pair * PAIR_COLS;
    for (Py_ssize_t row0 = first; row0 < end; row0 += DPBF16_ROWS) {
        const Py_ssize_t left = end - row0;
        /* constant row counts keep every accumulator in a register */
        switch (left < DPBF16_ROWS ? (int)left : DPBF16_ROWS) {
            DPBF16_CASE(1) DPBF16_CASE(2) DPBF16_CASE(3) DPBF16_CASE(4) DPBF16_CASE(5) DPBF16_CASE(6)
            DPBF16_CASE(7) DPBF16_CASE(8) DPBF16_CASE(9) DPBF16_CASE(10) DPBF16_CASE(11) DPBF16_CASE(12)
        }
    }
}

/* ------------------------------------------------- widened to float32 (AVX2) */
#define WIDEN_TARGET __attribute__((target("avx2,fma")))
#define WIDEN_ROWS 4 /* 8 accumulators, 4 widened weight vectors, 2 activations, 1 mask: 15 of 16 registers */

static inline __attribute__((always_inline)) WIDEN_TARGET void
widen_tile(const struct bf16_job *job, const uint16_t *weights, Py_ssize_t row0, int rows, Py_ssize_t col0)
{
    __m256 lo[WIDEN_ROWS], hi[WIDEN_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
    const Py_ssize_t k2 = job->k2, x_stride = job->x_stride;
    const int32_t *x = (const int32_t *)job->x_pairs + row0 * x_stride;
    for (Py_ssize_t j = 0; j < k2; j++) {
        /* 8 columns' (W[n][2j], W[n][2j+1]) per 32-bit lane: the even k is the low half */
        const __m256i w_lo = _mm256_loadu_si256((const __m256i *)(weights + j * 2 * PAIR_COLS));
        const __m256i w_hi = _mm256_loadu_si256((const __m256i *)(weights + j * 2 * PAIR_COLS + PANEL));
        const __m256 even_lo = _mm256_castsi256_ps(_mm256_slli_epi32(w_lo, 16));
        const __m256 odd_lo = _mm256_castsi256_ps(_mm256_and_si256(w_lo, high));
        const __m256 even_hi = _mm256_castsi256_ps(_mm256_slli_epi32(w_hi, 16));
        const __m256 odd_hi = _mm256_castsi256_ps(_mm256_and_si256(w_hi, high));
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) {
            const __m256i xi = _mm256_set1_epi32(x[r * x_stride + j]);
            const __m256 xe = _mm256_castsi256_ps(_mm256_slli_epi32(xi, 16));
            const __m256 xo = _mm256_castsi256_ps(_mm256_and_si256(xi, high));
            lo[r] = _mm256_fmadd_ps(xo, odd_lo, _mm256_fmadd_ps(xe, even_lo, lo[r]));
            hi[r] = _mm256_fmadd_ps(xo, odd_hi, _mm256_fmadd_ps(xe, even_hi, hi[r]));
        }
    }
    const Py_ssize_t valid = job->cols - col0 < PANEL ? job->cols - col0 : PANEL;
    float bias[PANEL] = {0};
    if (job->bias) memcpy(bias, job->bias + col0, (size_t)valid * sizeof(float));
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++) {
        float tmp[PANEL];
        _mm256_storeu_ps(tmp, _mm256_add_ps(lo[r], _mm256_loadu_ps(bias)));
        _mm256_storeu_ps(tmp + 8, _mm256_add_ps(hi[r], _mm256_loadu_ps(bias + 8)));
        memcpy(job->out + (row0 + r) * job->cols + col0, tmp, (size_t)valid * sizeof(float));
    }
}

#define WIDEN_CASE(n) case n: widen_tile(job, weights, row0, n, col0); break;

static WIDEN_TARGET void widen_pair(const struct bf16_job *job, Py_ssize_t pair, Py_ssize_t first, Py_ssize_t end)
{
    for (int panel = 0; panel < 2 && pair * PAIR_COLS + panel * PANEL < job->cols; panel++) {
        /* a panel's pairs start 16 values into each k pair's 32 columns */
        const uint16_t *weights = job->packed + pair * job->k2 * 2 * PAIR_COLS + panel * 2 * PANEL;
        const Py_ssize_t col0 = pair * PAIR_COLS + panel * PANEL;
        for (Py_ssize_t row0 = first; row0 < end; row0 += WIDEN_ROWS) {
            const Py_ssize_t left = end - row0;
            switch (left < WIDEN_ROWS ? (int)left : WIDEN_ROWS) { WIDEN_CASE(1) WIDEN_CASE(2) WIDEN_CASE(3) WIDEN_CASE(4) }
        }
    }
}

/* ----------------------------------------------------------- dispatching */
static void round_task(void *ctx, Py_ssize_t index, int slot)
{
    struct bf16_job *job = ctx;
    const Py_ssize_t first = index * CONVERT_ROWS_PER_TASK;
    const Py_ssize_t end = first + CONVERT_ROWS_PER_TASK < job->rows ? first + CONVERT_ROWS_PER_TASK : job->rows;
    for (Py_ssize_t r = first; r < end; r++) fd_bf16_round_row(job->x + r * job->depth, job->rounded + r * job->x_stride * 2, job->depth);
    (void)slot;
}

void fd_bf16_round_row(const float *x, uint16_t *out, Py_ssize_t depth)
{
    round_row(x, out, depth);
    if (depth % 2) out[depth] = 0;
}

/* Pairs from one activation row to the next: whole cache lines, and never a multiple of 2 KiB,
 * where a tile's 12 rows would share a few L1 sets and evict each other (depth 2048 ran at 146
 * GFLOP/s a core against ~185 for depth 512). */
static Py_ssize_t row_stride(Py_ssize_t k2)
{
    const Py_ssize_t stride = (k2 + 15) / 16 * 16;
    return stride % 512 == 0 ? stride + 16 : stride;
}

/* Task index = row block * pairs + pair. */
static void tile_task(void *ctx, Py_ssize_t index, int slot)
{
    const struct bf16_job *job = ctx;
    const Py_ssize_t pair = index % job->pairs, first = index / job->pairs * job->block_rows;
    const Py_ssize_t end = first + job->block_rows < job->rows ? first + job->block_rows : job->rows;
    if (job->dpbf16)
        dpbf16_pair(job, pair, first, end);
    else
        widen_pair(job, pair, first, end);
    (void)slot;
}

/* Rows per task: all of them, unless there are too few column pairs to keep the threads busy (a
 * narrow layer: 32 columns are one pair); then blocks of whole tiles, about TASKS_PER_THREAD tasks a
 * thread. */
#define TASKS_PER_THREAD 4
static Py_ssize_t block_rows(Py_ssize_t rows, Py_ssize_t pairs, int threads)
{
    const Py_ssize_t wanted = (Py_ssize_t)TASKS_PER_THREAD * (threads > 1 ? threads : 1);
    if (pairs >= wanted) return rows > 0 ? rows : 1;
    const Py_ssize_t blocks = (wanted + pairs - 1) / pairs, tile = DPBF16_ROWS; /* a multiple of WIDEN_ROWS */
    const Py_ssize_t per_block = (rows + blocks - 1) / blocks;
    return per_block < tile ? tile : (per_block + tile - 1) / tile * tile;
}

int native_cpu_has_bf16(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && native_cpu_isa() == ISA_AVX512;
}

PyObject *native_has_bf16(PyObject *self, PyObject *noargs) { return PyBool_FromLong(native_cpu_has_bf16()); }

/* round_bf16(x, out): float32 buffer -> bfloat16 bits (uint16), to nearest even */
PyObject *native_round_bf16(PyObject *self, PyObject *args)
{
    Py_buffer x, out;
    if (!PyArg_ParseTuple(args, "y*w*", &x, &out)) return NULL;
    PyObject *result = NULL;
    if (x.len % 4 != 0 || out.len * 2 != x.len) {
        PyErr_SetString(PyExc_ValueError, "round_bf16: out must hold one uint16 per float32 of x");
    } else {
        Py_BEGIN_ALLOW_THREADS
        round_row(x.buf, out.buf, x.len / 4);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    return result;
}

Py_ssize_t fd_bf16_packed_bytes(Py_ssize_t cols, Py_ssize_t depth)
{
    return (cols + PAIR_COLS - 1) / PAIR_COLS * ((depth + 1) / 2) * 2 * PAIR_COLS * (Py_ssize_t)sizeof(uint16_t);
}

Py_ssize_t fd_bf16_row_pairs(Py_ssize_t depth) { return row_stride((depth + 1) / 2); }

int fd_gemm_bf16(const struct gemm_args *a, int isa, int threads)
{
    const Py_ssize_t rows = a->rows, k2 = (a->depth + 1) / 2, pairs = (a->cols + PAIR_COLS - 1) / PAIR_COLS;
    const Py_ssize_t x_stride = row_stride(k2);
    uint16_t *rounded = (uint16_t *)a->x_bf16;
    if (rounded == NULL) {
        rounded = PyMem_RawMalloc((size_t)(rows > 0 ? rows : 1) * (size_t)x_stride * 2 * sizeof(uint16_t));
        if (rounded == NULL) return -1;
    }
    struct bf16_job job = {
        .x = a->x, .x_pairs = (const uint32_t *)rounded, .rounded = rounded, .packed = (const uint16_t *)a->packed,
        .out = a->out, .bias = a->bias, .rows = rows, .cols = a->cols, .depth = a->depth, .k2 = k2,
        .x_stride = x_stride, .pairs = pairs,
        .block_rows = block_rows(rows, pairs, threads),
        .dpbf16 = isa == ISA_AVX512 && native_cpu_has_bf16(),
    };
    if (a->x_bf16 == NULL)
        fd_parallel_for((rows + CONVERT_ROWS_PER_TASK - 1) / CONVERT_ROWS_PER_TASK, threads, round_task, &job);
    if (rows > 0) fd_parallel_for(pairs * ((rows + job.block_rows - 1) / job.block_rows), threads, tile_task, &job);
    if (a->x_bf16 == NULL) PyMem_RawFree(rounded);
    return 0;
}

/* gemm_bf16(x, packed, out, rows, cols, depth, isa, threads, bias or None) */
PyObject *native_gemm_bf16(PyObject *self, PyObject *args)
{
    int threads;
    Py_buffer x, packed, out, bias = {0};
    PyObject *bias_obj;
    Py_ssize_t rows, cols, depth;
    const char *isa_str;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnsiO", &x, &packed, &out, &rows, &cols, &depth, &isa_str, &threads,
                          &bias_obj))
        return NULL;
    PyObject *result = NULL;
    const int isa = native_isa_checked(isa_str);
    if (bias_obj != Py_None && PyObject_GetBuffer(bias_obj, &bias, PyBUF_SIMPLE) < 0) {
        /* PyObject_GetBuffer set the error */
    } else if (bias.obj && bias.len != cols * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "bias has %zd bytes, expected cols=%zd float32 values", bias.len, cols);
    } else if (isa < 0) {
        /* native_isa_checked set the error */
    } else if (rows < 0 || cols <= 0 || depth <= 0 || x.len != rows * depth * (Py_ssize_t)sizeof(float) ||
               out.len != rows * cols * (Py_ssize_t)sizeof(float) || packed.len != fd_bf16_packed_bytes(cols, depth)) {
        PyErr_Format(PyExc_ValueError, "gemm_bf16: buffer sizes do not match rows=%zd cols=%zd depth=%zd", rows,
                     cols, depth);
    } else {
        const struct gemm_args a = {x.buf, packed.buf, out.buf, rows, cols, depth, KIND_BF16, bias.obj ? bias.buf : NULL};
        int failed;
        Py_BEGIN_ALLOW_THREADS
        failed = fd_gemm_bf16(&a, isa, threads);
        Py_END_ALLOW_THREADS
        result = failed ? PyErr_NoMemory() : Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&packed);
    PyBuffer_Release(&out);
    if (bias.obj) PyBuffer_Release(&bias);
    return result;
}
