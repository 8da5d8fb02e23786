/*
 * Products of the sub-block kinds (blocks.h: Q4_0 .. IQ4_XS) with int8 activations, as llama.cpp
 * computes its quantised matmuls: the KIND_*_I8 twins of those kinds (opt-in,
 * FD_CPU_ACTIVATIONS=int8), on the very panels the float32 kernels read (block_packing.c).
 *
 * Why: the float32 kernels widen every weight to float32 and spend one FMA per weight and row.
 * With the activations in int8 too, one AVX-512 VNNI `vpdpbusd` multiplies and sums 64
 * weight-activation pairs, its AVX-VNNI form 32 (the AVX2 kernels, on CPUs with AVX-VNNI), and
 * plain AVX2 32 in four instructions (`vpsignb`, `vpmaddubsw`, `vpmaddwd`, `vpaddd`).
 *
 * Activations (gemm_int8.c's fd_quantize_rows): per row and 32-value block (one panel group),
 * sx = max|x| / 127, qx = round(x / sx) in -127..127; and each 16 qx's sum. Per row, column, group
 * and sub-block s (16 or 32 k) with the weights' integers qw (blocks.h: after offset or codebook),
 * effective scale d_s and minimum m_s, the integer dot D_s = sum qw qx is exact; then
 *     part = sum over s, in order, of fma(d_s, D_s, .) and (with a minimum) fma(m_s, sum_s qx, .)
 *     out += sx * part    (one FMA per group, groups in order)
 * Every instruction set performs these float operations in this order on the same exact integers,
 * so they agree bit for bit, and a row's result does not depend on the rows beside it.
 *
 * The panels hold the integers one k per 16 bytes (16 columns); the dot instructions take 4
 * consecutive k of a column per 32-bit lane. Each task therefore regroups its panel's integers once
 * into [depth / 4][16 columns][4 k] bytes (for either vpdpbusd + 128, unsigned, the dot corrected
 * by 128 sum qx; for maddubs signed, multiplied by |qx| with qx's sign, whose pairs stay below 2^15),
 * which every row tile then reads. That regrouping is paid per product, not per row: up to
 * FEW_ROWS rows (decode) run the float32 kernels instead, which read each weight once anyway.
 */
#pragma GCC target("avx2,fma,f16c") /* what isa.c checks for ISA_AVX2; the VNNI code adds its own */
#include "block_quants.h"

#include <string.h>

#define FEW_ROWS 4
#define VNNI_ROWS 4 /* rows per VNNI tile: 3 zmm each (total, part, dot) per panel, two panels */
#define AVX2_ROWS 2 /* rows per AVX2 tile: 6 ymm each */
#define QUANTIZE_ROWS_PER_TASK 16
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* The activations of one product, quantised. */
struct int8_acts {
    const int8_t *q;      /* [rows, depth] */
    const float *scale;   /* [rows, depth / 32] */
    const int32_t *sum16; /* [rows, depth / 16]: each 16 q's sum */
};

INLINE int32_t four_bytes(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The sum of q over sub-block s (`sub` k) of group g of row r. */
INLINE int32_t sub_sum(const struct int8_acts *x, Py_ssize_t depth, Py_ssize_t r, Py_ssize_t g, int s, int sub)
{
    const int32_t *p = x->sum16 + r * (depth / 16) + 2 * g;
    return sub == 16 ? p[s] : p[0] + p[1];
}

/* A panel's integers regrouped for the dot instructions: 4 consecutive k of each column side by
 * side, [depth / 4][16][4] bytes; `flip` adds 128 (vpdpbusd's unsigned operand). */
static void int8_weights(int kind, const uint8_t *panel, Py_ssize_t groups, int flip, uint8_t *w)
{
    const Py_ssize_t gbytes = group_bytes(kind);
    const __m128i bias = _mm_set1_epi8(flip ? (char)0x80 : 0);
    for (Py_ssize_t g = 0; g < groups; g++) {
        const uint8_t *grp = panel + g * gbytes;
        for (int k = 0; k < GROUP; k += 4) {
            const __m128i k0 = block_quants(kind, grp, k), k1 = block_quants(kind, grp, k + 1);
            const __m128i k2 = block_quants(kind, grp, k + 2), k3 = block_quants(kind, grp, k + 3);
            const __m128i lo01 = _mm_unpacklo_epi8(k0, k1), hi01 = _mm_unpackhi_epi8(k0, k1);
            const __m128i lo23 = _mm_unpacklo_epi8(k2, k3), hi23 = _mm_unpackhi_epi8(k2, k3);
            __m128i *dst = (__m128i *)(w + (g * GROUP + k) * PANEL);
            _mm_storeu_si128(dst, _mm_xor_si128(_mm_unpacklo_epi16(lo01, lo23), bias));     /* columns 0-3 */
            _mm_storeu_si128(dst + 1, _mm_xor_si128(_mm_unpackhi_epi16(lo01, lo23), bias)); /* 4-7 */
            _mm_storeu_si128(dst + 2, _mm_xor_si128(_mm_unpacklo_epi16(hi01, hi23), bias)); /* 8-11 */
            _mm_storeu_si128(dst + 3, _mm_xor_si128(_mm_unpackhi_epi16(hi01, hi23), bias)); /* 12-15 */
        }
    }
}

/* ------------------------------------------------------------- AVX-512 VNNI */
/* `width` (1 or 2) adjacent panels, the first at `panel` (panel_bytes apart; their regrouped
 * integers at w, depth * 16 bytes apart), for `rows` rows from row0: two panels share each
 * activation broadcast and sub-block sum. */
INLINE VNNI_TARGET void vnni_tile(const struct gemm_args *a, const struct int8_acts *x, const uint8_t *panel,
                                  Py_ssize_t panel_bytes, Py_ssize_t gbytes, int sub, int with_min, const uint8_t *w,
                                  int width, Py_ssize_t row0, int rows, Py_ssize_t col0)
{
    const Py_ssize_t depth = a->depth, groups = depth / GROUP;
    const int subs = GROUP / sub;
    __m512 total[VNNI_ROWS * 2];
    for (int i = 0; i < rows * width; i++) total[i] = _mm512_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g++) {
        __m512 part[VNNI_ROWS * 2];
        for (int i = 0; i < rows * width; i++) part[i] = _mm512_setzero_ps();
        for (int s = 0; s < subs; s++) {
            __m512i dot[VNNI_ROWS * 2];
            for (int i = 0; i < rows * width; i++) dot[i] = _mm512_setzero_si512();
            for (int k = s * sub; k < (s + 1) * sub; k += 4) {
                __m512i wv[2];
                for (int p = 0; p < width; p++) wv[p] = _mm512_loadu_si512(w + p * depth * PANEL + (g * GROUP + k) * PANEL);
                for (int r = 0; r < rows; r++) {
                    const __m512i xv = _mm512_set1_epi32(four_bytes(x->q + (row0 + r) * depth + g * GROUP + k));
                    for (int p = 0; p < width; p++) dot[r * width + p] = _mm512_dpbusd_epi32(dot[r * width + p], wv[p], xv);
                }
            }
            for (int p = 0; p < width; p++) {
                const uint8_t *grp = panel + p * panel_bytes + g * gbytes;
                const __m512 scale = _mm512_loadu_ps(grp + s * PANEL * 4);
                const __m512 minimum = with_min ? _mm512_loadu_ps(grp + (subs + s) * PANEL * 4) : scale;
                for (int r = 0; r < rows; r++) {
                    const int32_t total_q = sub_sum(x, depth, row0 + r, g, s, sub);
                    const __m512i d = _mm512_sub_epi32(dot[r * width + p], _mm512_set1_epi32(128 * total_q));
                    __m512 t = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(d), part[r * width + p]);
                    if (with_min) t = _mm512_fmadd_ps(minimum, _mm512_set1_ps((float)total_q), t);
                    part[r * width + p] = t;
                }
            }
        }
        for (int r = 0; r < rows; r++) {
            const __m512 sx = _mm512_set1_ps(x->scale[(row0 + r) * groups + g]);
            for (int p = 0; p < width; p++) total[r * width + p] = _mm512_fmadd_ps(part[r * width + p], sx, total[r * width + p]);
        }
    }
    for (int p = 0; p < width; p++) {
        const Py_ssize_t start = col0 + p * PANEL, valid = a->cols - start < PANEL ? a->cols - start : PANEL;
        const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
        for (int r = 0; r < rows; r++) {
            const __m512 t = total[r * width + p];
            _mm512_mask_storeu_ps(a->out + (row0 + r) * a->cols + start, mask,
                                  a->bias ? _mm512_add_ps(t, _mm512_maskz_loadu_ps(mask, a->bias + start)) : t);
        }
    }
}

INLINE VNNI_TARGET void vnni_rows(const struct gemm_args *a, const struct int8_acts *x, const uint8_t *panel,
                                  Py_ssize_t panel_bytes, Py_ssize_t gbytes, int sub, int with_min, const uint8_t *w,
                                  int width, Py_ssize_t col0)
{
    for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += VNNI_ROWS) {
        const Py_ssize_t left = a->rows - row0;
        const int rows = left < VNNI_ROWS ? (int)left : VNNI_ROWS;
        if (width == 2) {
#define PAIR_CASE(n) case n: vnni_tile(a, x, panel, panel_bytes, gbytes, sub, with_min, w, 2, row0, n, col0); break;
            switch (rows) { PAIR_CASE(1) PAIR_CASE(2) PAIR_CASE(3) PAIR_CASE(4) }
#undef PAIR_CASE
        } else {
#define ONE_CASE(n) case n: vnni_tile(a, x, panel, panel_bytes, gbytes, sub, with_min, w, 1, row0, n, col0); break;
            switch (rows) { ONE_CASE(1) ONE_CASE(2) ONE_CASE(3) ONE_CASE(4) }
#undef ONE_CASE
        }
    }
}

/* one copy of the tiles per sub-block size and minimum (all that they depend on the kind for) */
static VNNI_TARGET void vnni_panels(const struct gemm_args *a, const struct int8_acts *x, int kind, const uint8_t *panel,
                                    const uint8_t *w, int width, Py_ssize_t col0)
{
    const Py_ssize_t gbytes = group_bytes(kind), panel_bytes = a->depth / GROUP * gbytes;
    if (block_sub(kind) == 32)
        block_has_min(kind) ? vnni_rows(a, x, panel, panel_bytes, gbytes, 32, 1, w, width, col0)
                            : vnni_rows(a, x, panel, panel_bytes, gbytes, 32, 0, w, width, col0);
    else
        block_has_min(kind) ? vnni_rows(a, x, panel, panel_bytes, gbytes, 16, 1, w, width, col0)
                            : vnni_rows(a, x, panel, panel_bytes, gbytes, 16, 0, w, width, col0);
}

/* ------------------------------------------------------------------- AVX2 */
/* dot + the 8 columns' sums of 4 products w x: with AVX-VNNI's `vpdpbusd` (w unsigned: the weights + 128),
 * else |x| times w with x's sign through `vpmaddubsw` (pairs below 2^15) and `vpmaddwd`. The VNNI
 * instruction is written out (VEX encoded) because its intrinsic cannot be inlined into code that
 * also runs without it; it runs only where the CPU reports AVX-VNNI. */
INLINE __m256i avx2_dot(__m256i dot, __m256i w, __m256i xv, __m256i ax, int vnni)
{
    if (vnni) {
        __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(dot) : "x"(w), "x"(xv));
        return dot;
    }
    return _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, xv)), _mm256_set1_epi16(1)));
}

INLINE void avx2_tile(const struct gemm_args *a, const struct int8_acts *x, const uint8_t *panel, Py_ssize_t gbytes,
                      int sub, int with_min, int vnni, const uint8_t *w, Py_ssize_t row0, int rows, Py_ssize_t col0)
{
    const Py_ssize_t depth = a->depth, groups = depth / GROUP;
    const int subs = GROUP / sub;
    __m256 total[AVX2_ROWS][2];
    for (int r = 0; r < rows; r++) total[r][0] = total[r][1] = _mm256_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g++) {
        const uint8_t *grp = panel + g * gbytes;
        __m256 part[AVX2_ROWS][2];
        for (int r = 0; r < rows; r++) part[r][0] = part[r][1] = _mm256_setzero_ps();
        for (int s = 0; s < subs; s++) {
            __m256i dot[AVX2_ROWS][2];
            for (int r = 0; r < rows; r++) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
            for (int k = s * sub; k < (s + 1) * sub; k += 4) {
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + (g * GROUP + k) * PANEL));
                const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + (g * GROUP + k) * PANEL + 32));
                for (int r = 0; r < rows; r++) {
                    const __m256i xv = _mm256_set1_epi32(four_bytes(x->q + (row0 + r) * depth + g * GROUP + k));
                    const __m256i ax = vnni ? xv : _mm256_abs_epi8(xv);
                    dot[r][0] = avx2_dot(dot[r][0], w0, xv, ax, vnni);
                    dot[r][1] = avx2_dot(dot[r][1], w1, xv, ax, vnni);
                }
            }
            for (int h = 0; h < 2; h++) {
                const __m256 scale = _mm256_loadu_ps((const float *)(grp + s * PANEL * 4) + 8 * h);
                const __m256 minimum = with_min ? _mm256_loadu_ps((const float *)(grp + (subs + s) * PANEL * 4) + 8 * h) : scale;
                for (int r = 0; r < rows; r++) {
                    const int32_t total_q = sub_sum(x, depth, row0 + r, g, s, sub);
                    const __m256i d = vnni ? _mm256_sub_epi32(dot[r][h], _mm256_set1_epi32(128 * total_q)) : dot[r][h];
                    part[r][h] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(d), part[r][h]);
                    if (with_min) part[r][h] = _mm256_fmadd_ps(minimum, _mm256_set1_ps((float)total_q), part[r][h]);
                }
            }
        }
        for (int r = 0; r < rows; r++) {
            const __m256 sx = _mm256_set1_ps(x->scale[(row0 + r) * groups + g]);
            total[r][0] = _mm256_fmadd_ps(part[r][0], sx, total[r][0]);
            total[r][1] = _mm256_fmadd_ps(part[r][1], sx, total[r][1]);
        }
    }
    const Py_ssize_t valid = a->cols - col0 < PANEL ? a->cols - col0 : PANEL;
    for (int r = 0; r < rows; r++) {
        float t[PANEL];
        _mm256_storeu_ps(t, total[r][0]);
        _mm256_storeu_ps(t + 8, total[r][1]);
        float *dst = a->out + (row0 + r) * a->cols + col0;
        if (a->bias)
            for (Py_ssize_t n = 0; n < valid; n++) dst[n] = t[n] + a->bias[col0 + n];
        else
            memcpy(dst, t, (size_t)valid * sizeof(float));
    }
}

INLINE void avx2_rows(const struct gemm_args *a, const struct int8_acts *x, const uint8_t *panel, Py_ssize_t gbytes,
                      int sub, int with_min, int vnni, const uint8_t *w, Py_ssize_t col0)
{
    for (Py_ssize_t row0 = 0; row0 < a->rows; row0 += AVX2_ROWS) {
        if (a->rows - row0 >= 2)
            avx2_tile(a, x, panel, gbytes, sub, with_min, vnni, w, row0, 2, col0);
        else
            avx2_tile(a, x, panel, gbytes, sub, with_min, vnni, w, row0, 1, col0);
    }
}

INLINE void avx2_kind_rows(const struct gemm_args *a, const struct int8_acts *x, int kind, const uint8_t *panel,
                           int vnni, const uint8_t *w, Py_ssize_t col0)
{
    const Py_ssize_t gbytes = group_bytes(kind);
    if (block_sub(kind) == 32)
        block_has_min(kind) ? avx2_rows(a, x, panel, gbytes, 32, 1, vnni, w, col0) : avx2_rows(a, x, panel, gbytes, 32, 0, vnni, w, col0);
    else
        block_has_min(kind) ? avx2_rows(a, x, panel, gbytes, 16, 1, vnni, w, col0) : avx2_rows(a, x, panel, gbytes, 16, 0, vnni, w, col0);
}

static void avx2_panel(const struct gemm_args *a, const struct int8_acts *x, int kind, const uint8_t *panel,
                       int vnni, const uint8_t *w, Py_ssize_t col0)
{
    if (vnni)
        avx2_kind_rows(a, x, kind, panel, 1, w, col0);
    else
        avx2_kind_rows(a, x, kind, panel, 0, w, col0);
}

/* ----------------------------------------------------------- dispatching */
enum { MODE_AVX2 = 0, MODE_AVX_VNNI = 1, MODE_AVX512_VNNI = 2 }; /* fd_int8_dots' numbers */

static int widest_dots = MODE_AVX512_VNNI; /* fd_int8_dots' cap */

int fd_int8_dots(int isa, int widest)
{
    if (widest >= MODE_AVX2 && widest <= MODE_AVX512_VNNI) widest_dots = widest;
    __builtin_cpu_init();
    const int mode = isa == ISA_AVX512 && native_cpu_has_vnni() ? MODE_AVX512_VNNI
                     : __builtin_cpu_supports("avxvnni")           ? MODE_AVX_VNNI
                                                                   : MODE_AVX2;
    return mode < widest_dots ? mode : widest_dots;
}

struct blocks_int8_job {
    const struct gemm_args *a;
    struct int8_acts x;
    int8_t *q;
    float *scale;
    int32_t *sum32, *sum16;
    int kind, mode;
    volatile int failed; /* a task found no scratch memory */
};

static void quantize_task(void *ctx, Py_ssize_t index, int slot)
{
    struct blocks_int8_job *job = ctx;
    const Py_ssize_t first = index * QUANTIZE_ROWS_PER_TASK, rows = job->a->rows, depth = job->a->depth;
    const Py_ssize_t end = first + QUANTIZE_ROWS_PER_TASK < rows ? first + QUANTIZE_ROWS_PER_TASK : rows;
    fd_quantize_rows(job->a->x, first, end, depth, job->q, job->scale, job->sum32);
    for (Py_ssize_t r = first; r < end; r++)
        for (Py_ssize_t b = 0; b < depth / 16; b++) {
            int32_t total = 0;
            for (int k = 0; k < 16; k++) total += job->q[r * depth + b * 16 + k];
            job->sum16[r * (depth / 16) + b] = total;
        }
    (void)slot;
}

/* Task t: panels 2t and 2t + 1 (where the matrix has it). */
static void panel_task(void *ctx, Py_ssize_t t, int slot)
{
    struct blocks_int8_job *job = ctx;
    const struct gemm_args *a = job->a;
    const Py_ssize_t groups = a->depth / GROUP, panel_bytes = groups * group_bytes(job->kind);
    const Py_ssize_t first = 2 * t, panels = (a->cols + PANEL - 1) / PANEL;
    const int width = first + 1 < panels ? 2 : 1;
    uint8_t *w = fd_thread_scratch((size_t)a->depth * PANEL * 2);
    (void)slot;
    if (w == NULL) {
        job->failed = 1;
        return;
    }
    for (int p = 0; p < width; p++)
        int8_weights(job->kind, a->packed + (first + p) * panel_bytes, groups, job->mode != MODE_AVX2, w + p * a->depth * PANEL);
    if (job->mode == MODE_AVX512_VNNI)
        vnni_panels(a, &job->x, job->kind, a->packed + first * panel_bytes, w, width, first * PANEL);
    else
        for (int p = 0; p < width; p++)
            avx2_panel(a, &job->x, job->kind, a->packed + (first + p) * panel_bytes, job->mode == MODE_AVX_VNNI,
                       w + p * a->depth * PANEL, (first + p) * PANEL);
}

int gemm_blocks_int8(const struct gemm_args *a, int isa, int threads)
{
    const int kind = subblock_layout(a->kind);
    if (a->rows <= FEW_ROWS) {
        struct gemm_args twin = *a;
        twin.kind = kind;
        return gemm_blocks(&twin, isa, threads);
    }
    const Py_ssize_t blocks = a->depth / GROUP, sixteens = a->depth / 16;
    char *memory = PyMem_RawMalloc((size_t)a->rows * ((size_t)blocks * 8 + (size_t)sixteens * 4 + (size_t)a->depth));
    if (memory == NULL) return -1;
    struct blocks_int8_job job = {.a = a, .kind = kind, .mode = fd_int8_dots(isa, -1)};
    job.scale = (float *)memory;
    job.sum32 = (int32_t *)(memory + (size_t)a->rows * blocks * 4);
    job.sum16 = (int32_t *)(memory + (size_t)a->rows * blocks * 8);
    job.q = (int8_t *)(memory + (size_t)a->rows * (blocks * 8 + sixteens * 4));
    job.x = (struct int8_acts){job.q, job.scale, job.sum16};
    fd_parallel_for((a->rows + QUANTIZE_ROWS_PER_TASK - 1) / QUANTIZE_ROWS_PER_TASK, threads, quantize_task, &job);
    fd_parallel_for(((a->cols + PANEL - 1) / PANEL + 1) / 2, threads, panel_task, &job);
    PyMem_RawFree(memory);
    return job.failed ? -1 : 0;
}
