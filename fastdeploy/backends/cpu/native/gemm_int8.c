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
 * Every dot form computes the same integer dots exactly (AVX2's 16-bit partial sums are bounded
 * below 2^15) and the same float operations in the same order, so they agree bit for bit. The dots
 * are fd_int8_dots' (capped as the sub-block kinds' are): AVX-512 VNNI's `vpdpbusd`, its 256-bit
 * AVX-VNNI form in the AVX2 kernels where the CPU has it (the weights + 128 as VNNI-512 takes them,
 * a `vpdpbusd` for 32 pairs where maddubs needs abs, sign, maddubs and madd), else maddubs.
 *
 * Tiles: a product of up to 4 rows reads each weight once and a decode token's weights stream from
 * memory, so what bounds it is how many loads are in flight, not the dots: one row takes two panels
 * at once (two streams of weights, two independent dot chains), AVX-512 all its rows so, AVX2 two
 * rows of one panel (two panels' 16 accumulators would spill); panels go in tasks of four (one
 * panel per task, claimed alternately by the threads, broke each thread's stream every 17 KB: Q8_0
 * then ran 10-15% slower than float32 from memory, see docs/architecture.md), each block's bytes
 * prefetched PREFETCH_BYTES ahead, as gemm_blocks_int8_rows.c's.
 */
#include "blocks_int8.h" /* prefetch_ahead, four_bytes, avx_vnni_dot */
#include "native.h"

#include <immintrin.h>
#include <math.h>

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

#define INLINE static inline __attribute__((always_inline))
#define MAX_ROWS 4 /* gemm_blocks_int8.c sends at most FEW_ROWS rows here */
#define MAX_PANELS 2
#define PANELS_PER_TASK 4
_Static_assert(FEW_ROWS <= MAX_ROWS, "gemm_int8 takes at most MAX_ROWS rows");

/* ------------------------------------------------------------- AVX-512 VNNI */
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* R rows times P adjacent panels from panel p: P streams of weights, R * P independent dots. */
INLINE VNNI_TARGET void zmm_tile(int kind, int R, int P, const struct gemm_args *a, const struct int8_rows *x,
                                 Py_ssize_t p)
{
    const Py_ssize_t depth = x->depth, blocks = x->blocks, bytes = BLOCK_BYTES(kind);
    const uint8_t *panel = a->packed + p * blocks * bytes;
    __m512 acc[MAX_PANELS][MAX_ROWS];
    for (int i = 0; i < P; i++)
        for (int r = 0; r < R; r++) acc[i][r] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const uint8_t *blk[MAX_PANELS];
        __m512 d[MAX_PANELS];
        __m512i dot[MAX_PANELS][MAX_ROWS];
        for (int i = 0; i < P; i++) {
            blk[i] = panel + (i * blocks + b) * bytes;
            prefetch_ahead(blk[i], bytes);
            d[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk[i]));
            for (int r = 0; r < R; r++) dot[i][r] = _mm512_setzero_si512();
        }
        const int8_t *q = x->q + b * QBLOCK;
        if (kind == KIND_Q8_0_I8) {
            for (int g = 0; g < QBLOCK / 4; g++)
                for (int r = 0; r < R; r++) {
                    const __m512i xv = _mm512_set1_epi32(four_bytes(q + r * depth + 4 * g));
                    for (int i = 0; i < P; i++)
                        dot[i][r] = _mm512_dpbusd_epi32(dot[i][r], _mm512_loadu_si512(blk[i] + 2 * PANEL + 64 * g), xv);
                }
            for (int r = 0; r < R; r++) {
                const __m512i bias = _mm512_set1_epi32(128 * x->sum[r * blocks + b]);
                const __m512 s = _mm512_set1_ps(x->scale[r * blocks + b]);
                for (int i = 0; i < P; i++) {
                    const __m512 t = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[i][r], bias));
                    acc[i][r] = _mm512_fmadd_ps(_mm512_mul_ps(d[i], t), s, acc[i][r]);
                }
            }
        } else {
            for (int c = 0; c < QBLOCK / 8; c++) {
                __m512i lo[MAX_PANELS], hi[MAX_PANELS];
                for (int i = 0; i < P; i++) {
                    const __m512i v = _mm512_loadu_si512(blk[i] + 4 * PANEL + 64 * c);
                    lo[i] = _mm512_and_si512(v, low);
                    hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                }
                for (int r = 0; r < R; r++) {
                    const __m512i xa = _mm512_set1_epi32(four_bytes(q + r * depth + 8 * c));
                    const __m512i xc = _mm512_set1_epi32(four_bytes(q + r * depth + 8 * c + 4));
                    for (int i = 0; i < P; i++) {
                        dot[i][r] = _mm512_dpbusd_epi32(dot[i][r], lo[i], xa);
                        dot[i][r] = _mm512_dpbusd_epi32(dot[i][r], hi[i], xc);
                    }
                }
            }
            for (int r = 0; r < R; r++) {
                const __m512 total = _mm512_set1_ps((float)x->sum[r * blocks + b]);
                const __m512 s = _mm512_set1_ps(x->scale[r * blocks + b]);
                for (int i = 0; i < P; i++) {
                    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk[i] + 2 * PANEL)));
                    const __m512 t = _mm512_fmadd_ps(m, total, _mm512_mul_ps(d[i], _mm512_cvtepi32_ps(dot[i][r])));
                    acc[i][r] = _mm512_fmadd_ps(t, s, acc[i][r]);
                }
            }
        }
    }
    for (int i = 0; i < P; i++) {
        const Py_ssize_t col0 = (p + i) * PANEL, valid = a->cols - col0 < PANEL ? a->cols - col0 : PANEL;
        const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
        const __m512 bias = a->bias ? _mm512_maskz_loadu_ps(mask, a->bias + col0) : _mm512_setzero_ps();
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(a->out + r * a->cols + col0, mask, _mm512_add_ps(acc[i][r], bias));
    }
}

/* All rows (at most MAX_ROWS) times panels [first, end), two panels at a time. */
INLINE VNNI_TARGET void zmm_panels(int kind, const struct gemm_args *a, const struct int8_rows *x, Py_ssize_t first,
                                   Py_ssize_t end)
{
    const int rows = (int)a->rows;
    for (Py_ssize_t p = first; p < end;) {
        const int P = p + 1 < end ? 2 : 1;
#define ZMM_CASE(R)                                                                                   \
    case R:                                                                                           \
        if (P == 2) zmm_tile(kind, R, 2, a, x, p);                                                    \
        else zmm_tile(kind, R, 1, a, x, p);                                                           \
        break;
        switch (rows) {
            ZMM_CASE(1) ZMM_CASE(2) ZMM_CASE(3) ZMM_CASE(4)
        }
#undef ZMM_CASE
        p += P;
    }
}

/* ------------------------------------------------------------------- AVX2 */
#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX2_TILE 2 /* rows per tile, more rows than one */

enum { DOTS_MADDUBS, DOTS_AVX_VNNI };

/* 8 columns' 32-bit sums of the 16-bit pairs in s */
INLINE AVX2_TARGET __m256i avx2_widen(__m256i s) { return _mm256_madd_epi16(s, _mm256_set1_epi16(1)); }

/* R rows from row0 times P adjacent panels from panel p, each panel's 16 columns in two halves
 * (lo: 0-7, hi: 8-15); `dots` as the enum. */
INLINE AVX2_TARGET void ymm_tile(int kind, int dots, int R, int P, const struct gemm_args *a, const struct int8_rows *x,
                                 Py_ssize_t row0, Py_ssize_t p)
{
    const Py_ssize_t depth = x->depth, blocks = x->blocks, bytes = BLOCK_BYTES(kind);
    const uint8_t *panel = a->packed + p * blocks * bytes;
    __m256 acc[MAX_PANELS][AVX2_TILE][2];
    for (int i = 0; i < P; i++)
        for (int r = 0; r < R; r++) acc[i][r][0] = acc[i][r][1] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8((char)0x80);
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const uint8_t *blk[MAX_PANELS];
        __m256i dot[MAX_PANELS][AVX2_TILE][2];
        for (int i = 0; i < P; i++) {
            blk[i] = panel + (i * blocks + b) * bytes;
            prefetch_ahead(blk[i], bytes);
            for (int r = 0; r < R; r++) dot[i][r][0] = dot[i][r][1] = _mm256_setzero_si256();
        }
        const int8_t *q = x->q + row0 * depth + b * QBLOCK;
        if (kind == KIND_Q8_0_I8) {
            for (int g = 0; g < QBLOCK / 4; g++)
                for (int i = 0; i < P; i++) {
                    __m256i w[2];
                    for (int h = 0; h < 2; h++)
                        w[h] = _mm256_loadu_si256((const __m256i *)(blk[i] + 2 * PANEL + 64 * g + 32 * h));
                    if (dots == DOTS_MADDUBS) /* back to signed weights (in -127..127, packing.c) */
                        for (int h = 0; h < 2; h++) w[h] = _mm256_xor_si256(w[h], flip);
                    for (int r = 0; r < R; r++) {
                        const __m256i xv = _mm256_set1_epi32(four_bytes(q + r * depth + 4 * g));
                        if (dots == DOTS_AVX_VNNI) {
                            for (int h = 0; h < 2; h++) dot[i][r][h] = avx_vnni_dot(dot[i][r][h], w[h], xv);
                        } else {
                            /* |x| (unsigned) times w with x's sign: pairs of products <= 2 * 127 * 127, no
                             * 16-bit saturation */
                            const __m256i ax = _mm256_abs_epi8(xv);
                            for (int h = 0; h < 2; h++) {
                                const __m256i pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w[h], xv));
                                dot[i][r][h] = _mm256_add_epi32(dot[i][r][h], avx2_widen(pairs));
                            }
                        }
                    }
                }
            for (int r = 0; r < R; r++) {
                const __m256 s = _mm256_set1_ps(x->scale[(row0 + r) * blocks + b]);
                /* the AVX-VNNI dots took the weights + 128 */
                const int32_t offset = dots == DOTS_AVX_VNNI ? 128 * x->sum[(row0 + r) * blocks + b] : 0;
                const __m256i bias = _mm256_set1_epi32(offset);
                for (int i = 0; i < P; i++)
                    for (int h = 0; h < 2; h++) {
                        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk[i] + 16 * h)));
                        const __m256 t = _mm256_cvtepi32_ps(_mm256_sub_epi32(dot[i][r][h], bias));
                        acc[i][r][h] = _mm256_fmadd_ps(_mm256_mul_ps(d, t), s, acc[i][r][h]);
                    }
            }
        } else {
            /* maddubs: 16-bit partial sums of the whole block, 8 products of pairs <= 2 * 15 * 127, below 2^15 */
            for (int c = 0; c < QBLOCK / 8; c++)
                for (int i = 0; i < P; i++) {
                    __m256i lo[2], hi[2];
                    for (int h = 0; h < 2; h++) {
                        const __m256i v = _mm256_loadu_si256((const __m256i *)(blk[i] + 4 * PANEL + 64 * c + 32 * h));
                        lo[h] = _mm256_and_si256(v, low);
                        hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                    }
                    for (int r = 0; r < R; r++) {
                        const __m256i xa = _mm256_set1_epi32(four_bytes(q + r * depth + 8 * c));
                        const __m256i xc = _mm256_set1_epi32(four_bytes(q + r * depth + 8 * c + 4));
                        for (int h = 0; h < 2; h++)
                            if (dots == DOTS_AVX_VNNI)
                                dot[i][r][h] = avx_vnni_dot(avx_vnni_dot(dot[i][r][h], lo[h], xa), hi[h], xc);
                            else {
                                const __m256i both = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], xa),
                                                                      _mm256_maddubs_epi16(hi[h], xc));
                                dot[i][r][h] = _mm256_add_epi16(dot[i][r][h], both);
                            }
                    }
                }
            for (int r = 0; r < R; r++) {
                const __m256 total = _mm256_set1_ps((float)x->sum[(row0 + r) * blocks + b]);
                const __m256 s = _mm256_set1_ps(x->scale[(row0 + r) * blocks + b]);
                for (int i = 0; i < P; i++)
                    for (int h = 0; h < 2; h++) {
                        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk[i] + 16 * h)));
                        const __m128i half = _mm_loadu_si128((const __m128i *)(blk[i] + 2 * PANEL + 16 * h));
                        const __m256 m = _mm256_cvtph_ps(half);
                        const __m256i sums = dots == DOTS_AVX_VNNI ? dot[i][r][h] : avx2_widen(dot[i][r][h]);
                        const __m256 t = _mm256_fmadd_ps(m, total, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sums)));
                        acc[i][r][h] = _mm256_fmadd_ps(t, s, acc[i][r][h]);
                    }
            }
        }
    }
    for (int i = 0; i < P; i++) {
        const Py_ssize_t col0 = (p + i) * PANEL, valid = a->cols - col0 < PANEL ? a->cols - col0 : PANEL;
        for (int r = 0; r < R; r++) {
            float tmp[PANEL];
            _mm256_storeu_ps(tmp, acc[i][r][0]);
            _mm256_storeu_ps(tmp + 8, acc[i][r][1]);
            float *dst = a->out + (row0 + r) * a->cols + col0;
            for (Py_ssize_t c = 0; c < valid; c++) dst[c] = tmp[c] + (a->bias ? a->bias[col0 + c] : 0.0f);
        }
    }
}

/* All rows times panels [first, end): one row two panels at a time, more rows AVX2_TILE at a time per panel. */
INLINE AVX2_TARGET void ymm_panels(int kind, int dots, const struct gemm_args *a, const struct int8_rows *x,
                                   Py_ssize_t first, Py_ssize_t end)
{
    if (a->rows == 1) {
        for (Py_ssize_t p = first; p < end;)
            if (p + 1 < end) {
                ymm_tile(kind, dots, 1, 2, a, x, 0, p);
                p += 2;
            } else
                ymm_tile(kind, dots, 1, 1, a, x, 0, p++);
        return;
    }
    for (Py_ssize_t p = first; p < end; p++)
        for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX2_TILE)
            if (a->rows - row0 >= 2) ymm_tile(kind, dots, 2, 1, a, x, row0, p);
            else ymm_tile(kind, dots, 1, 1, a, x, row0, p);
}

/* ----------------------------------------------------------- dispatching */
/* all rows of a product times panels [first, end) */
typedef void (*panels_fn)(const struct gemm_args *a, const struct int8_rows *x, Py_ssize_t first, Py_ssize_t end);

#define PANELS_FNS(K)                                                                                         \
    static VNNI_TARGET void zmm_##K(const struct gemm_args *a, const struct int8_rows *x, Py_ssize_t first,     \
                                    Py_ssize_t end)                                                            \
    {                                                                                                          \
        zmm_panels(KIND_##K, a, x, first, end);                                                                \
    }                                                                                                          \
    static AVX2_TARGET void avxvnni_##K(const struct gemm_args *a, const struct int8_rows *x, Py_ssize_t first, \
                                        Py_ssize_t end)                                                        \
    {                                                                                                          \
        ymm_panels(KIND_##K, DOTS_AVX_VNNI, a, x, first, end);                                                 \
    }                                                                                                          \
    static AVX2_TARGET void maddubs_##K(const struct gemm_args *a, const struct int8_rows *x, Py_ssize_t first, \
                                        Py_ssize_t end)                                                        \
    {                                                                                                          \
        ymm_panels(KIND_##K, DOTS_MADDUBS, a, x, first, end);                                                  \
    }
PANELS_FNS(Q8_0_I8)
PANELS_FNS(Q4_1_I8)
#undef PANELS_FNS

struct int8_job {
    const struct gemm_args *a;
    struct int8_rows x;
    panels_fn fn;
    Py_ssize_t panels;
};

static void int8_task(void *ctx, Py_ssize_t task, int slot)
{
    const struct int8_job *job = ctx;
    const Py_ssize_t first = task * PANELS_PER_TASK;
    job->fn(job->a, &job->x, first, first + PANELS_PER_TASK < job->panels ? first + PANELS_PER_TASK : job->panels);
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
    float *scale = (float *)memory;
    int32_t *sum = (int32_t *)(memory + (size_t)a->rows * blocks * 4);
    int8_t *q = (int8_t *)(memory + (size_t)a->rows * blocks * 8);
    /* at most 4 rows: one task, no parallel loop to start (decode runs ~100 products a token) */
    fd_quantize_rows(a->x, 0, a->rows, a->depth, q, scale, sum);
    const int mode = fd_int8_dots(isa, -1), q8 = a->kind == KIND_Q8_0_I8;
    const panels_fn fn = mode == MODE_AVX512_VNNI ? (q8 ? zmm_Q8_0_I8 : zmm_Q4_1_I8)
                         : mode == MODE_AVX_VNNI  ? (q8 ? avxvnni_Q8_0_I8 : avxvnni_Q4_1_I8)
                                                  : (q8 ? maddubs_Q8_0_I8 : maddubs_Q4_1_I8);
    struct int8_job job = {a, {q, scale, sum, a->depth, blocks}, fn, (a->cols + PANEL - 1) / PANEL};
    fd_parallel_for((job.panels + PANELS_PER_TASK - 1) / PANELS_PER_TASK, threads, int8_task, &job);
    PyMem_RawFree(memory);
    return 0;
}
