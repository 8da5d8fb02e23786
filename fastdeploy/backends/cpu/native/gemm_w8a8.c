/*
 * Matrix products of int8 weights with one scale per output channel (FastDeploy's wint8) and int8
 * activations with one scale per row and 128 inputs (KIND_W8A8; opt-in: quantization="wint8" with
 * FD_CPU_ACTIVATIONS=int8).
 *
 * Why: a prompt pass of many rows is bound by arithmetic. On the Sapphire/Emerald Rapids class cores
 * this was measured on, register-only loops retire ~2.8 G `vpdpbusd` a second (64 multiply-adds
 * each) against ~3.8 G 512-bit float32 FMAs (16 each): ~3x the float32 rate, while `vdpbf16ps`
 * retires only ~0.9 G (32 each: below float32). The Q8_0 blocks of gemm_int8.c carry a scale per 32 inputs of each
 * column, so every 8 dot instructions need ~4 float ones to scale and add the block's sum; here
 * the weight's scale applies once, when a tile is stored, and an activation group's once per 32 dot
 * instructions: the dots are ~90% of the instructions.
 *
 * Numbers: weights q_w in -127..127 with scale w_s[n] (out = w_s[n] * sum_k x[k] q_w[n][k]);
 * activations per row and group g of QGROUP inputs: s = max|x| / 127, q_x = round(x / s) in
 * -127..127, and the group's sum S of q_x. Per group the integer dot D = sum q_w q_x is exact, then
 *   acc += s * float(D);    out = acc * w_s[n] + bias[n]
 * in that order on both instruction sets, so AVX-512 and AVX2 give the same bits.
 *
 * Weights, packed once at load (native/__init__.py `pack_w8a8`): [panels][depth / 4][16 columns][4]
 * bytes q_w + 128 (unsigned, as `vpdpbusd` takes its first operand; the dot then carries 128 * S,
 * taken off as an integer), columns past `cols` zero; then w_s as float32 [panels * 16].
 *
 * Kernels: AVX-512 VNNI tiles of 4 rows x 48 columns (12 integer and 12 float accumulators); AVX2
 * tiles of 2 rows x 16 columns with `vpmaddubsw` on |q_x| and sign-adjusted weights (pairs of
 * products <= 2 * 127 * 127, no 16-bit saturation). Work is split over blocks of 3 panels, and for a
 * narrow weight over blocks of rows too. AMX tiles are not used: some of the VMs this runs in list
 * AMX but fault on its instructions.
 */
#include "native.h"

#include <immintrin.h>
#include <string.h>

#define QGROUP 128
#define QUANTIZE_ROWS_PER_TASK 16
#define TILE_PANELS 3 /* panels a task's column block holds */
#define VNNI_TILE_ROWS 4
#define AVX2_TILE_ROWS 2
#define TASKS_PER_THREAD 4

Py_ssize_t fd_w8a8_packed_bytes(Py_ssize_t cols, Py_ssize_t depth)
{
    const Py_ssize_t panels = (cols + PANEL - 1) / PANEL;
    return panels * PANEL * depth + panels * PANEL * (Py_ssize_t)sizeof(float);
}

/* The activations of one product, quantised. */
struct w8a8_job {
    const struct gemm_args *a;
    const float *w_scale; /* [panels * 16] after the packed levels */
    int8_t *q;            /* [rows, depth] */
    float *scale;         /* [rows, groups] */
    int32_t *bias128;     /* [rows, groups]: 128 * the group's sum of q */
    Py_ssize_t groups, panels, column_blocks, block_rows;
    int vnni, avx512;
};

/* Rows first..end-1 of x quantised per QGROUP inputs (the last group may be shorter; depth is a
 * multiple of 32), 16 (AVX-512) or 8 (AVX2) values a step: the same bits either way, x * (127 / peak)
 * rounded to nearest even by the conversion (the default rounding mode). A scalar loop here took as
 * long as the product itself (fmaxf is a library call unless the compiler may vectorise it). */
#define QUANTIZE_ROWS(name, target, vector, width, load, zero, abs_max, reduce_max, levels_of, store_levels)       \
    static target void name(const float *x, Py_ssize_t first, Py_ssize_t end, Py_ssize_t depth,                  \
                            Py_ssize_t groups, int8_t *q, float *scale, int32_t *bias128)                        \
    {                                                                                                             \
        for (Py_ssize_t r = first; r < end; r++)                                                                  \
            for (Py_ssize_t g = 0; g < groups; g++) {                                                             \
                const Py_ssize_t k0 = g * QGROUP, count = depth - k0 < QGROUP ? depth - k0 : QGROUP;              \
                const float *xg = x + r * depth + k0;                                                             \
                int8_t *qg = q + r * depth + k0;                                                                  \
                vector peak_v = zero;                                                                             \
                for (Py_ssize_t k = 0; k < count; k += width) peak_v = abs_max(load(xg + k), peak_v);             \
                const float peak = reduce_max(peak_v), inverse = peak > 0.0f ? 127.0f / peak : 0.0f;              \
                int32_t total = 0;                                                                                \
                for (Py_ssize_t k = 0; k < count; k += width) total += store_levels(qg + k, levels_of(load(xg + k), inverse)); \
                scale[r * groups + g] = peak / 127.0f;                                                            \
                bias128[r * groups + g] = 128 * total;                                                            \
            }                                                                                                     \
    }

#define AVX512_QUANT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define AVX2_QUANT_TARGET __attribute__((target("avx2,fma")))

/* max(|v|, peak); a NaN in v leaves peak (as fmaxf would) */
static inline __attribute__((always_inline)) AVX512_QUANT_TARGET __m512 abs_max16(__m512 v, __m512 peak)
{
    return _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF))), peak);
}
static inline __attribute__((always_inline)) AVX512_QUANT_TARGET __m512i levels16(__m512 v, float inverse)
{
    const __m512 bound = _mm512_set1_ps(127.0f);
    const __m512 t = _mm512_mul_ps(v, _mm512_set1_ps(inverse));
    return _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(t, bound), _mm512_set1_ps(-127.0f)));
}
static inline __attribute__((always_inline)) AVX512_QUANT_TARGET int32_t store16(int8_t *out, __m512i levels)
{
    _mm_storeu_si128((__m128i *)out, _mm512_cvtepi32_epi8(levels));
    return _mm512_reduce_add_epi32(levels);
}
QUANTIZE_ROWS(quantize_avx512, AVX512_QUANT_TARGET, __m512, 16, _mm512_loadu_ps, _mm512_setzero_ps(), abs_max16,
              _mm512_reduce_max_ps, levels16, store16)

static inline __attribute__((always_inline)) AVX2_QUANT_TARGET __m256 abs_max8(__m256 v, __m256 peak)
{
    return _mm256_max_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF))), peak);
}
static inline __attribute__((always_inline)) AVX2_QUANT_TARGET float reduce_max8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
static inline __attribute__((always_inline)) AVX2_QUANT_TARGET __m256i levels8(__m256 v, float inverse)
{
    const __m256 bound = _mm256_set1_ps(127.0f);
    const __m256 t = _mm256_mul_ps(v, _mm256_set1_ps(inverse));
    return _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(t, bound), _mm256_set1_ps(-127.0f)));
}
static inline __attribute__((always_inline)) AVX2_QUANT_TARGET int32_t store8(int8_t *out, __m256i levels)
{
    int32_t values[8], total = 0;
    _mm256_storeu_si256((__m256i *)values, levels);
    for (int i = 0; i < 8; i++) {
        out[i] = (int8_t)values[i];
        total += values[i];
    }
    return total;
}
QUANTIZE_ROWS(quantize_avx2, AVX2_QUANT_TARGET, __m256, 8, _mm256_loadu_ps, _mm256_setzero_ps(), abs_max8, reduce_max8,
              levels8, store8)

static inline int32_t four_bytes(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ------------------------------------------------------------- AVX-512 VNNI */
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

static inline __attribute__((always_inline)) VNNI_TARGET void
vnni_tile(const struct w8a8_job *j, Py_ssize_t row0, int rows, Py_ssize_t panel0, int panels)
{
    const struct gemm_args *a = j->a;
    const Py_ssize_t depth = a->depth, groups = j->groups, stride = depth * PANEL;
    const uint8_t *w = a->packed + panel0 * stride;
    const int8_t *q = j->q + row0 * depth;
    __m512 acc[VNNI_TILE_ROWS][TILE_PANELS];
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < panels; p++) acc[r][p] = _mm512_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g++) {
        const Py_ssize_t k0 = g * QGROUP, k1 = depth - k0 < QGROUP ? depth : k0 + QGROUP;
        __m512i dot[VNNI_TILE_ROWS][TILE_PANELS];
        for (int r = 0; r < rows; r++)
            for (int p = 0; p < panels; p++) dot[r][p] = _mm512_setzero_si512();
        for (Py_ssize_t k = k0; k < k1; k += 4) {
            __m512i wv[TILE_PANELS];
            for (int p = 0; p < panels; p++) wv[p] = _mm512_loadu_si512(w + p * stride + k * PANEL);
            for (int r = 0; r < rows; r++) {
                const __m512i xv = _mm512_set1_epi32(four_bytes(q + r * depth + k));
                for (int p = 0; p < panels; p++) dot[r][p] = _mm512_dpbusd_epi32(dot[r][p], wv[p], xv);
            }
        }
        for (int r = 0; r < rows; r++) {
            const Py_ssize_t at = (row0 + r) * groups + g;
            const __m512i correction = _mm512_set1_epi32(j->bias128[at]);
            const __m512 s = _mm512_set1_ps(j->scale[at]);
            for (int p = 0; p < panels; p++)
                acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dot[r][p], correction)), s, acc[r][p]);
        }
    }
    for (int p = 0; p < panels; p++) {
        const Py_ssize_t col0 = (panel0 + p) * PANEL;
        const Py_ssize_t valid = a->cols - col0 < PANEL ? a->cols - col0 : PANEL;
        const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
        const __m512 ws = _mm512_loadu_ps(j->w_scale + col0);
        const __m512 bias = a->bias ? _mm512_maskz_loadu_ps(mask, a->bias + col0) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++)
            _mm512_mask_storeu_ps(a->out + (row0 + r) * a->cols + col0, mask,
                                  _mm512_add_ps(_mm512_mul_ps(acc[r][p], ws), bias));
    }
}

#define VNNI_ROWS_CASE(n, p) case n: vnni_tile(j, row0, n, panel0, p); break;
#define VNNI_PANELS_CASE(p)                                                                                  \
    case p:                                                                                                  \
        for (Py_ssize_t row0 = first; row0 < end; row0 += VNNI_TILE_ROWS) {                                  \
            const Py_ssize_t left = end - row0;                                                              \
            switch (left < VNNI_TILE_ROWS ? (int)left : VNNI_TILE_ROWS) {                                    \
                VNNI_ROWS_CASE(1, p) VNNI_ROWS_CASE(2, p) VNNI_ROWS_CASE(3, p) VNNI_ROWS_CASE(4, p)          \
            }                                                                                                \
        }                                                                                                    \
        break;

static VNNI_TARGET void vnni_block(const struct w8a8_job *j, Py_ssize_t panel0, int panels, Py_ssize_t first,
                                   Py_ssize_t end)
{
    /* constant tile shapes keep every accumulator in a register */
    switch (panels) { VNNI_PANELS_CASE(1) VNNI_PANELS_CASE(2) VNNI_PANELS_CASE(3) }
}

/* ------------------------------------------------------------------- AVX2 */
#define AVX2_TARGET __attribute__((target("avx2,fma")))

static inline __attribute__((always_inline)) AVX2_TARGET void avx2_tile(const struct w8a8_job *j, Py_ssize_t row0,
                                                                        int rows, Py_ssize_t panel)
{
    const struct gemm_args *a = j->a;
    const Py_ssize_t depth = a->depth, groups = j->groups;
    const uint8_t *w = a->packed + panel * depth * PANEL;
    const int8_t *q = j->q + row0 * depth;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 lo[AVX2_TILE_ROWS], hi[AVX2_TILE_ROWS];
    for (int r = 0; r < rows; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g++) {
        const Py_ssize_t k0 = g * QGROUP, k1 = depth - k0 < QGROUP ? depth : k0 + QGROUP;
        __m256i dot_lo[AVX2_TILE_ROWS], dot_hi[AVX2_TILE_ROWS];
        for (int r = 0; r < rows; r++) dot_lo[r] = dot_hi[r] = _mm256_setzero_si256();
        for (Py_ssize_t k = k0; k < k1; k += 4) {
            /* back to signed levels; then |x| (unsigned) times w with x's sign */
            const __m256i w_lo = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + k * PANEL)), flip);
            const __m256i w_hi = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + k * PANEL + 32)), flip);
            for (int r = 0; r < rows; r++) {
                const __m256i xv = _mm256_set1_epi32(four_bytes(q + r * depth + k)), ax = _mm256_abs_epi8(xv);
                dot_lo[r] = _mm256_add_epi32(dot_lo[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w_lo, xv)), ones));
                dot_hi[r] = _mm256_add_epi32(dot_hi[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w_hi, xv)), ones));
            }
        }
        for (int r = 0; r < rows; r++) {
            /* the signed levels' dot: no 128 * S to take off here */
            const __m256 s = _mm256_set1_ps(j->scale[(row0 + r) * groups + g]);
            lo[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_lo[r]), s, lo[r]);
            hi[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_hi[r]), s, hi[r]);
        }
    }
    const Py_ssize_t col0 = panel * PANEL, valid = a->cols - col0 < PANEL ? a->cols - col0 : PANEL;
    float bias[PANEL] = {0};
    if (a->bias) memcpy(bias, a->bias + col0, (size_t)valid * sizeof(float));
    const __m256 ws_lo = _mm256_loadu_ps(j->w_scale + col0), ws_hi = _mm256_loadu_ps(j->w_scale + col0 + 8);
    for (int r = 0; r < rows; r++) {
        float tmp[PANEL];
        _mm256_storeu_ps(tmp, _mm256_add_ps(_mm256_mul_ps(lo[r], ws_lo), _mm256_loadu_ps(bias)));
        _mm256_storeu_ps(tmp + 8, _mm256_add_ps(_mm256_mul_ps(hi[r], ws_hi), _mm256_loadu_ps(bias + 8)));
        memcpy(a->out + (row0 + r) * a->cols + col0, tmp, (size_t)valid * sizeof(float));
    }
}

static AVX2_TARGET void avx2_block(const struct w8a8_job *j, Py_ssize_t panel0, int panels, Py_ssize_t first,
                                   Py_ssize_t end)
{
    for (int p = 0; p < panels; p++)
        for (Py_ssize_t row0 = first; row0 < end; row0 += AVX2_TILE_ROWS) {
            if (end - row0 >= 2)
                avx2_tile(j, row0, 2, panel0 + p);
            else
                avx2_tile(j, row0, 1, panel0 + p);
        }
}

/* ----------------------------------------------------------- dispatching */
static void quantize_task(void *ctx, Py_ssize_t index, int slot)
{
    struct w8a8_job *j = ctx;
    const Py_ssize_t first = index * QUANTIZE_ROWS_PER_TASK, rows = j->a->rows;
    const Py_ssize_t end = first + QUANTIZE_ROWS_PER_TASK < rows ? first + QUANTIZE_ROWS_PER_TASK : rows;
    (j->avx512 ? quantize_avx512 : quantize_avx2)(j->a->x, first, end, j->a->depth, j->groups, j->q, j->scale, j->bias128);
    (void)slot;
}

/* Task index = row block * column blocks + column block. */
static void tile_task(void *ctx, Py_ssize_t index, int slot)
{
    const struct w8a8_job *j = ctx;
    const Py_ssize_t block = index % j->column_blocks, first = index / j->column_blocks * j->block_rows;
    const Py_ssize_t end = first + j->block_rows < j->a->rows ? first + j->block_rows : j->a->rows;
    const Py_ssize_t panel0 = block * TILE_PANELS;
    const int panels = j->panels - panel0 < TILE_PANELS ? (int)(j->panels - panel0) : TILE_PANELS;
    if (j->vnni)
        vnni_block(j, panel0, panels, first, end);
    else
        avx2_block(j, panel0, panels, first, end);
    (void)slot;
}

/* Rows per task: all of them, unless too few column blocks keep the threads busy; then blocks of
 * whole tiles, about TASKS_PER_THREAD tasks a thread. */
static Py_ssize_t block_rows(Py_ssize_t rows, Py_ssize_t column_blocks, int threads)
{
    const Py_ssize_t wanted = (Py_ssize_t)TASKS_PER_THREAD * (threads > 1 ? threads : 1);
    if (column_blocks >= wanted) return rows;
    const Py_ssize_t blocks = (wanted + column_blocks - 1) / column_blocks, tile = VNNI_TILE_ROWS;
    const Py_ssize_t per_block = (rows + blocks - 1) / blocks;
    return per_block < tile ? tile : (per_block + tile - 1) / tile * tile;
}

int fd_gemm_w8a8(const struct gemm_args *a, int isa, int threads)
{
    const Py_ssize_t rows = a->rows, depth = a->depth, groups = (depth + QGROUP - 1) / QGROUP;
    const Py_ssize_t panels = (a->cols + PANEL - 1) / PANEL;
    char *memory = PyMem_RawMalloc((size_t)rows * ((size_t)groups * 8 + (size_t)depth) + 1);
    if (memory == NULL) return -1;
    struct w8a8_job j = {
        .a = a, .w_scale = (const float *)(a->packed + panels * PANEL * depth), .groups = groups, .panels = panels,
        .column_blocks = (panels + TILE_PANELS - 1) / TILE_PANELS,
        .vnni = isa == ISA_AVX512 && native_cpu_has_vnni(), .avx512 = isa == ISA_AVX512,
    };
    j.scale = (float *)memory;
    j.bias128 = (int32_t *)(memory + (size_t)rows * groups * 4);
    j.q = (int8_t *)(memory + (size_t)rows * groups * 8);
    j.block_rows = block_rows(rows, j.column_blocks, threads);
    fd_parallel_for((rows + QUANTIZE_ROWS_PER_TASK - 1) / QUANTIZE_ROWS_PER_TASK, threads, quantize_task, &j);
    fd_parallel_for(j.column_blocks * ((rows + j.block_rows - 1) / j.block_rows), threads, tile_task, &j);
    PyMem_RawFree(memory);
    return 0;
}
