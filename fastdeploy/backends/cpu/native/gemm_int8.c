/*
 * Matrix products with int8 activations (opt-in: FD_CPU_ACTIVATIONS=int8), as llama.cpp computes
 * its quantised matmuls: here those of up to 4 rows (decoding); more rows take gemm_blocks_int8.c's
 * tiles, which regroup each panel once per product and compute the same float operations.
 *
 * Why: the float path dequantises every weight to float32 in registers and multiplies in float32:
 * ~10 instructions per 32 weights and row. Quantising the activations too lets the weights stay
 * integers: one `vpdpbusd` (AVX-512 VNNI) multiplies and sums 64 weight-activation pairs, and AVX2's
 * `vpmaddubsw` + `vpmaddwd` 32. The cost is accuracy: each 32-value block of an activation row is
 * rounded to 255 levels (benchmarks/accuracy.py measures it).
 *
 * Activations: per row and 32-value block, scale s = max|x| / 127, q = round(x / s) (int8), and the
 * block's sum of q. Weights: the I8 layouts of packing.c (4 consecutive k's of a column side by side).
 * Per block, with the integer dot D = sum_k q_w q_x:
 *   Q8_0: out += s * (d_w * D)               (weights stored + 128; D corrected by 128 * sum q_x)
 *   Q4_1: out += s * (m_w * sum q_x + d_w * D)  (d_w * D rounded first, as gemm_blocks_int8.c)
 * Both instruction sets compute the same integer dots exactly (AVX2's 16-bit partial sums are
 * bounded below 2^15) and the same float operations in the same order, so they agree bit for bit.
 */
#include "blocks_int8.h" /* prefetch_ahead */
#include "native.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define QBLOCK 32
#define BLOCK_BYTES(kind) ((kind) == KIND_Q4_1_I8 ? PANEL * 4 + PANEL * QBLOCK / 2 : PANEL * 2 + PANEL * QBLOCK)

/* The activations of one product, quantised. */
struct int8_rows {
    const int8_t *q;     /* [rows, depth] */
    const float *scale;  /* [rows, blocks] */
    const int32_t *sum;  /* [rows, blocks] */
    Py_ssize_t depth, blocks;
};

void fd_quantize_rows(const float *x, Py_ssize_t first, Py_ssize_t end, Py_ssize_t depth, int8_t *q,
                      float *scale, int32_t *sum)
{
    const Py_ssize_t blocks = depth / QBLOCK;
    for (Py_ssize_t r = first; r < end; r++)
        for (Py_ssize_t b = 0; b < blocks; b++) {
            const float *xb = x + r * depth + b * QBLOCK;
            int8_t *qb = q + r * depth + b * QBLOCK;
            float peak = 0.0f;
            for (int k = 0; k < QBLOCK; k++) peak = fmaxf(peak, fabsf(xb[k]));
            const float s = peak / 127.0f, inverse = peak > 0.0f ? 127.0f / peak : 0.0f;
            int32_t total = 0;
            for (int k = 0; k < QBLOCK; k++) {
                const int32_t v = (int32_t)nearbyintf(xb[k] * inverse);
                qb[k] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
                total += qb[k];
            }
            scale[r * blocks + b] = s;
            sum[r * blocks + b] = total;
        }
}

static inline int32_t four_bytes(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ------------------------------------------------------------- AVX-512 VNNI */
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define VNNI_ROWS 4 /* gemm_blocks_int8.c sends at most FEW_ROWS = 4 rows here */

static inline __attribute__((always_inline)) VNNI_TARGET void
vnni_tile(const struct gemm_args *a, const struct int8_rows *x, const uint8_t *panel, Py_ssize_t row0, int rows,
          Py_ssize_t col0)
{
    __m512 acc[VNNI_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    const Py_ssize_t depth = x->depth, blocks = x->blocks;
    const int8_t *q = x->q + row0 * depth;
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const uint8_t *blk = panel + b * BLOCK_BYTES(a->kind);
        prefetch_ahead(blk, BLOCK_BYTES(a->kind));
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        __m512i dot[VNNI_ROWS];
        for (int r = 0; r < rows; r++) dot[r] = _mm512_setzero_si512();
        if (a->kind == KIND_Q8_0_I8) {
            for (int g = 0; g < QBLOCK / 4; g++) {
                const __m512i w = _mm512_loadu_si512(blk + 2 * PANEL + 64 * g);
                for (int r = 0; r < rows; r++)
                    dot[r] = _mm512_dpbusd_epi32(dot[r], w, _mm512_set1_epi32(four_bytes(q + r * depth + b * QBLOCK + 4 * g)));
            }
            for (int r = 0; r < rows; r++) {
                const int32_t bias = 128 * x->sum[(row0 + r) * blocks + b];
                const __m512 t = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[r], _mm512_set1_epi32(bias)));
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, t), _mm512_set1_ps(x->scale[(row0 + r) * blocks + b]), acc[r]);
            }
        } else {
            const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 2 * PANEL)));
            for (int c = 0; c < QBLOCK / 8; c++) {
                const __m512i v = _mm512_loadu_si512(blk + 4 * PANEL + 64 * c);
                const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                for (int r = 0; r < rows; r++) {
                    const int8_t *xb = q + r * depth + b * QBLOCK + 8 * c;
                    dot[r] = _mm512_dpbusd_epi32(dot[r], lo, _mm512_set1_epi32(four_bytes(xb)));
                    dot[r] = _mm512_dpbusd_epi32(dot[r], hi, _mm512_set1_epi32(four_bytes(xb + 4)));
                }
            }
            for (int r = 0; r < rows; r++) {
                const float total = (float)x->sum[(row0 + r) * blocks + b];
                const __m512 t = _mm512_fmadd_ps(m, _mm512_set1_ps(total), _mm512_mul_ps(d, _mm512_cvtepi32_ps(dot[r])));
                acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(x->scale[(row0 + r) * blocks + b]), acc[r]);
            }
        }
    }
    const Py_ssize_t valid = a->cols - col0 < PANEL ? a->cols - col0 : PANEL;
    const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
    const __m512 bias = a->bias ? _mm512_maskz_loadu_ps(mask, a->bias + col0) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++)
        _mm512_mask_storeu_ps(a->out + (row0 + r) * a->cols + col0, mask, _mm512_add_ps(acc[r], bias));
}

#define VNNI_CASE(n) case n: vnni_tile(a, x, panel, row0, n, col0); break;

static VNNI_TARGET void vnni_panel(const struct gemm_args *a, const struct int8_rows *x, Py_ssize_t p)
{
    const uint8_t *panel = a->packed + p * x->blocks * BLOCK_BYTES(a->kind);
    const Py_ssize_t col0 = p * PANEL;
    for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += VNNI_ROWS) {
        const Py_ssize_t left = a->rows - row0;
        switch (left < VNNI_ROWS ? (int)left : VNNI_ROWS) {
            VNNI_CASE(1) VNNI_CASE(2) VNNI_CASE(3) VNNI_CASE(4)
        }
    }
}

/* ------------------------------------------------------------------- AVX2 */
#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX2_INT8_ROWS 2

/* 8 columns' 32-bit sums of the 16-bit pairs in s */
static inline __attribute__((always_inline)) AVX2_TARGET __m256i avx2_widen(__m256i s)
{
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

static inline __attribute__((always_inline)) AVX2_TARGET void
avx2_int8_tile(const struct gemm_args *a, const struct int8_rows *x, const uint8_t *panel, Py_ssize_t row0, int rows,
               Py_ssize_t col0)
{
    __m256 acc_lo[AVX2_INT8_ROWS], acc_hi[AVX2_INT8_ROWS];
    for (int r = 0; r < rows; r++) acc_lo[r] = acc_hi[r] = _mm256_setzero_ps();
    const Py_ssize_t depth = x->depth, blocks = x->blocks;
    const int8_t *q = x->q + row0 * depth;
    const __m256i low = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8((char)0x80);
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const uint8_t *blk = panel + b * BLOCK_BYTES(a->kind);
        prefetch_ahead(blk, BLOCK_BYTES(a->kind));
        const __m256 d_lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        const __m256 d_hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
        __m256i dot_lo[AVX2_INT8_ROWS], dot_hi[AVX2_INT8_ROWS];
        if (a->kind == KIND_Q8_0_I8) {
            for (int r = 0; r < rows; r++) dot_lo[r] = dot_hi[r] = _mm256_setzero_si256();
            for (int g = 0; g < QBLOCK / 4; g++) {
                /* back to signed weights (in -127..127, packing.c); then |x| (unsigned) times w with
                 * x's sign: pairs of products <= 2 * 127 * 127, no 16-bit saturation */
                const __m256i w_lo = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2 * PANEL + 64 * g)), flip);
                const __m256i w_hi = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2 * PANEL + 64 * g + 32)), flip);
                for (int r = 0; r < rows; r++) {
                    const __m256i xv = _mm256_set1_epi32(four_bytes(q + r * depth + b * QBLOCK + 4 * g));
                    const __m256i ax = _mm256_abs_epi8(xv);
                    dot_lo[r] = _mm256_add_epi32(dot_lo[r], avx2_widen(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w_lo, xv))));
                    dot_hi[r] = _mm256_add_epi32(dot_hi[r], avx2_widen(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w_hi, xv))));
                }
            }
            for (int r = 0; r < rows; r++) {
                const __m256 s = _mm256_set1_ps(x->scale[(row0 + r) * blocks + b]);
                acc_lo[r] = _mm256_fmadd_ps(_mm256_mul_ps(d_lo, _mm256_cvtepi32_ps(dot_lo[r])), s, acc_lo[r]);
                acc_hi[r] = _mm256_fmadd_ps(_mm256_mul_ps(d_hi, _mm256_cvtepi32_ps(dot_hi[r])), s, acc_hi[r]);
            }
        } else {
            const __m256 m_lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 2 * PANEL)));
            const __m256 m_hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 2 * PANEL + 16)));
            /* 16-bit partial sums of the whole block: 8 products of pairs <= 2 * 15 * 127, below 2^15 */
            for (int r = 0; r < rows; r++) dot_lo[r] = dot_hi[r] = _mm256_setzero_si256();
            for (int c = 0; c < QBLOCK / 8; c++) {
                const __m256i v_lo = _mm256_loadu_si256((const __m256i *)(blk + 4 * PANEL + 64 * c));
                const __m256i v_hi = _mm256_loadu_si256((const __m256i *)(blk + 4 * PANEL + 64 * c + 32));
                const __m256i lo_lo = _mm256_and_si256(v_lo, low), hi_lo = _mm256_and_si256(_mm256_srli_epi16(v_lo, 4), low);
                const __m256i lo_hi = _mm256_and_si256(v_hi, low), hi_hi = _mm256_and_si256(_mm256_srli_epi16(v_hi, 4), low);
                for (int r = 0; r < rows; r++) {
                    const int8_t *xb = q + r * depth + b * QBLOCK + 8 * c;
                    const __m256i xa = _mm256_set1_epi32(four_bytes(xb)), xc = _mm256_set1_epi32(four_bytes(xb + 4));
                    dot_lo[r] = _mm256_add_epi16(dot_lo[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo_lo, xa), _mm256_maddubs_epi16(hi_lo, xc)));
                    dot_hi[r] = _mm256_add_epi16(dot_hi[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo_hi, xa), _mm256_maddubs_epi16(hi_hi, xc)));
                }
            }
            for (int r = 0; r < rows; r++) {
                const __m256 total = _mm256_set1_ps((float)x->sum[(row0 + r) * blocks + b]);
                const __m256 s = _mm256_set1_ps(x->scale[(row0 + r) * blocks + b]);
                const __m256 t_lo = _mm256_fmadd_ps(m_lo, total, _mm256_mul_ps(d_lo, _mm256_cvtepi32_ps(avx2_widen(dot_lo[r]))));
                const __m256 t_hi = _mm256_fmadd_ps(m_hi, total, _mm256_mul_ps(d_hi, _mm256_cvtepi32_ps(avx2_widen(dot_hi[r]))));
                acc_lo[r] = _mm256_fmadd_ps(t_lo, s, acc_lo[r]);
                acc_hi[r] = _mm256_fmadd_ps(t_hi, s, acc_hi[r]);
            }
        }
    }
    const Py_ssize_t valid = a->cols - col0 < PANEL ? a->cols - col0 : PANEL;
    for (int r = 0; r < rows; r++) {
        float tmp[PANEL];
        _mm256_storeu_ps(tmp, acc_lo[r]);
        _mm256_storeu_ps(tmp + 8, acc_hi[r]);
        for (Py_ssize_t c = 0; c < valid; c++) a->out[(row0 + r) * a->cols + col0 + c] = tmp[c] + (a->bias ? a->bias[col0 + c] : 0.0f);
    }
}

static AVX2_TARGET void avx2_int8_panel(const struct gemm_args *a, const struct int8_rows *x, Py_ssize_t p)
{
    const uint8_t *panel = a->packed + p * x->blocks * BLOCK_BYTES(a->kind);
    const Py_ssize_t col0 = p * PANEL;
    for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX2_INT8_ROWS) {
        if (a->rows - row0 >= 2)
            avx2_int8_tile(a, x, panel, row0, 2, col0);
        else
            avx2_int8_tile(a, x, panel, row0, 1, col0);
    }
}

/* ----------------------------------------------------------- dispatching */
struct int8_job {
    const struct gemm_args *a;
    struct int8_rows x;
    int8_t *q;
    float *scale;
    int32_t *sum;
    const float *source;
    Py_ssize_t panels;
    int vnni;
};

#define QUANTIZE_ROWS_PER_TASK 16

static void quantize_task(void *ctx, Py_ssize_t index, int slot)
{
    struct int8_job *job = ctx;
    const Py_ssize_t first = index * QUANTIZE_ROWS_PER_TASK, rows = job->a->rows;
    const Py_ssize_t end = first + QUANTIZE_ROWS_PER_TASK < rows ? first + QUANTIZE_ROWS_PER_TASK : rows;
    fd_quantize_rows(job->source, first, end, job->x.depth, job->q, job->scale, job->sum);
    (void)slot;
}

static void int8_panel_task(void *ctx, Py_ssize_t p, int slot)
{
    const struct int8_job *job = ctx;
    if (job->vnni)
        vnni_panel(job->a, &job->x, p);
    else
        avx2_int8_panel(job->a, &job->x, p);
    (void)slot;
}

int native_cpu_has_vnni(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && native_cpu_isa() == ISA_AVX512;
}

int gemm_int8(const struct gemm_args *a, int isa, int threads)
{
    const Py_ssize_t blocks = a->depth / QBLOCK;
    char *memory = PyMem_RawMalloc((size_t)a->rows * ((size_t)a->depth + (size_t)blocks * 8) + 1);
    if (memory == NULL) return -1;
    struct int8_job job = {.a = a, .source = a->x, .panels = (a->cols + PANEL - 1) / PANEL};
    job.scale = (float *)memory;
    job.sum = (int32_t *)(memory + (size_t)a->rows * blocks * 4);
    job.q = (int8_t *)(memory + (size_t)a->rows * blocks * 8);
    job.x = (struct int8_rows){job.q, job.scale, job.sum, a->depth, blocks};
    job.vnni = isa == ISA_AVX512 && native_cpu_has_vnni();
    if (a->rows <= QUANTIZE_ROWS_PER_TASK) /* one task: no parallel loop to start (decode runs ~100 products a token) */
        quantize_task(&job, 0, 0);
    else
        fd_parallel_for((a->rows + QUANTIZE_ROWS_PER_TASK - 1) / QUANTIZE_ROWS_PER_TASK, threads, quantize_task, &job);
    fd_parallel_for(job.panels, threads, int8_panel_task, &job);
    PyMem_RawFree(memory);
    return 0;
}
