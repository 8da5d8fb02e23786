/*
 * Bidirectional attention within segments with bfloat16 products (FD_CPU_VISION_MATMUL=bfloat16 on a
 * CPU with AVX512_BF16): encoder_attention.c's work, with both products on `vdpbf16ps`.
 *
 * Why: after the linear layers moved to bfloat16 (gemm_bf16.c), the float32 attention was about 40%
 * of a 1024-patch image's encoding. Its two products (scores q.k, then probabilities times values)
 * are as arithmetic-bound as the linear layers, and bfloat16 pairs halve their instructions.
 *
 * Numerics: q * scale, k and v rounded to bfloat16 (to nearest even by vcvtneps2bf16, as gemm_bf16.c
 * rounds); scores summed in float32; softmax in float32 (max, exp); out = (sum_j bf16(e_j) v_j) /
 * sum_j e_j with e_j = exp(s_j - max), the sums in float32.
 *
 * Layout, per (segment, head), in the pairs `vdpbf16ps` multiplies (32 bits: two bfloat16 values):
 *   keys   [padded / CHUNK][head_dim / 2][CHUNK]: pair (k[j][2i], k[j][2i+1]) at [j / CHUNK][i][j % CHUNK],
 *          so one broadcast query pair times one 16-key load adds two products to 16 scores, and a
 *          chunk's keys are read as one contiguous block (rows of all keys read chunk by chunk ran
 *          ~4% slower);
 *   values [padded / 2][head_dim]: pair (v[2j][d], v[2j+1][d]) at [j][d], so one broadcast pair of
 *          probabilities times one load of 16 dims adds two keys' products to 16 outputs.
 * Padding (keys past the segment, up to a multiple of CHUNK) is left unwritten: its scores are masked
 * out of the softmax (their probabilities are zero) and the values are read up to the last key pair.
 * Up to ROWS query rows of one head share every key and value load (24 accumulators of 32 registers).
 * head_dim must be a multiple of 16 (whole vectors), at most 512. The Python side uses the float32 kernel for other
 * head_dims and on CPUs without AVX512_BF16, where widened bfloat16 would be slower than float32.
 */
#include "native.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#define ROWS 6   /* query rows sharing each key / value load */
#define CHUNK 64 /* keys scored at once: 4 vectors x ROWS rows = 24 accumulators */
#define DIMS 64  /* output dims accumulated at once: 4 vectors x ROWS rows */
#define MAX_HEAD_DIM 512

struct job {
    const struct encoder_item *items;
    const struct encoder_input *in;
    float *out;
    uint32_t *keys, *values;   /* laid out pairs, per (segment, head) */
    const int64_t *starts;     /* [segments + 1] first token of each segment, then the token count */
    const Py_ssize_t *offsets; /* [segments] first pair of each segment's laid-out keys (and values) */
    Py_ssize_t heads, head_dim, longest;
    float scale;
    _Atomic int out_of_memory;
};

/* A segment's key count rounded up to whole chunks. */
static Py_ssize_t padded_length(Py_ssize_t count) { return (count + CHUNK - 1) / CHUNK * CHUNK; }

/* 16 floats times `scale`, rounded to bfloat16 (vcvtneps2bf16: to nearest even, NaN kept). */
static inline __attribute__((always_inline)) BF16_TARGET __m256i round16(const float *x, __m512 scale)
{
    return (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(x), scale));
}

/* A row of head_dim floats times `scale` as head_dim / 2 pairs: bfloat16 values in order are
 * already the pairs (x[2i], x[2i+1]). */
static inline __attribute__((always_inline)) BF16_TARGET void
row_pairs(const float *x, float scale, Py_ssize_t head_dim, uint32_t *pairs)
{
    for (Py_ssize_t d = 0; d < head_dim; d += 16)
        _mm256_storeu_si256((__m256i *)(pairs + d / 2), round16(x + d, _mm512_set1_ps(scale)));
}

/* Keys and values of segment index / heads, head index % heads, into their pair layouts. */
static BF16_TARGET void layout_task(void *ctx, Py_ssize_t index, int slot)
{
    struct job *job = ctx;
    const Py_ssize_t s = index / job->heads, h = index % job->heads, head_dim = job->head_dim;
    const Py_ssize_t start = job->starts[s], count = job->starts[s + 1] - start, padded = padded_length(count);
    const struct encoder_input *in = job->in;
    const Py_ssize_t row = in->stride, pairs = head_dim / 2;
    uint32_t *keys = job->keys + job->offsets[s] + h * pairs * padded;
    uint32_t *values = job->values + job->offsets[s] + h * pairs * padded;
    uint32_t key_pairs[MAX_HEAD_DIM / 2];
    for (Py_ssize_t j = 0; j < count; j++) {
        row_pairs(encoder_key_row(in, start + j, h, head_dim), 1.0f, head_dim, key_pairs);
        uint32_t *chunk = keys + j / CHUNK * pairs * CHUNK + j % CHUNK;
        for (Py_ssize_t i = 0; i < pairs; i++) chunk[i * CHUNK] = key_pairs[i];
    }
    const __m512 one = _mm512_set1_ps(1.0f);
    for (Py_ssize_t j = 0; j < count; j += 2) {
        const float *first = in->v0 + (start + j) * row + h * head_dim;
        for (Py_ssize_t d = 0; d < head_dim; d += 16) {
            const __m512i low = _mm512_cvtepu16_epi32(round16(first + d, one));
            const __m512i high = j + 1 < count ? _mm512_cvtepu16_epi32(round16(first + row + d, one)) : _mm512_setzero_si512();
            _mm512_storeu_si512(values + j / 2 * head_dim + d, _mm512_or_si512(low, _mm512_slli_epi32(high, 16)));
        }
    }
    (void)slot;
}

/* scores[r][c .. c + CHUNK) for `rows` query rows of pairs q[r][i] (c a multiple of CHUNK). */
static inline __attribute__((always_inline)) BF16_TARGET void
score_chunk(const uint32_t *q, int rows, const uint32_t *keys, Py_ssize_t padded, Py_ssize_t pairs, Py_ssize_t c,
            float *scores)
{
    __m512 acc[ROWS][CHUNK / 16];
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < CHUNK / 16; i++) acc[r][i] = _mm512_setzero_ps();
    for (Py_ssize_t p = 0; p < pairs; p++) {
        __m512bh k[CHUNK / 16];
        for (int i = 0; i < CHUNK / 16; i++) k[i] = (__m512bh)_mm512_loadu_si512(keys + c * pairs + p * CHUNK + 16 * i);
        for (int r = 0; r < rows; r++) {
            const __m512bh qv = (__m512bh)_mm512_set1_epi32((int)q[r * pairs + p]);
            for (int i = 0; i < CHUNK / 16; i++) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], qv, k[i]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < CHUNK / 16; i++) _mm512_storeu_ps(scores + r * padded + c + 16 * i, acc[r][i]);
}

/* out[r][d0 .. d0 + 16 * vecs) = (sum over key pairs of probs[r] x values) * inverse[r]. */
static inline __attribute__((always_inline)) BF16_TARGET void
weigh_values(const uint32_t *probs, int rows, Py_ssize_t stride, Py_ssize_t key_pairs, const uint32_t *values,
             Py_ssize_t head_dim, Py_ssize_t d0, int vecs, const float *inverse, float *out, Py_ssize_t row_stride)
{
    __m512 acc[ROWS][DIMS / 16];
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < vecs; i++) acc[r][i] = _mm512_setzero_ps();
    for (Py_ssize_t j = 0; j < key_pairs; j++) {
        __m512bh v[DIMS / 16];
        for (int i = 0; i < vecs; i++) v[i] = (__m512bh)_mm512_loadu_si512(values + j * head_dim + d0 + 16 * i);
        for (int r = 0; r < rows; r++) {
            const __m512bh pv = (__m512bh)_mm512_set1_epi32((int)probs[r * stride + j]);
            for (int i = 0; i < vecs; i++) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], pv, v[i]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < vecs; i++)
            _mm512_storeu_ps(out + r * row_stride + d0 + 16 * i, _mm512_mul_ps(acc[r][i], _mm512_set1_ps(inverse[r])));
}

/* e^x of 16 floats, x <= 0: exp_f32's range reduction (native.h), 2^n by scalef, and a degree-5
 * Taylor polynomial (relative error below 3e-6: a thousandth of bfloat16's rounding step, which
 * the result is rounded to next; degree 7 took a third longer per score). */
static inline __attribute__((always_inline)) BF16_TARGET __m512 exp16(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 120.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Of scores[0, count): e_j = exp(s_j - max) rounded to bfloat16 (vcvtneps2bf16: to nearest even)
 * into probs[0, padded) (zero past count); returns 1 / the sum of the e_j (before rounding: the
 * same to a few float32 ulps, and not waiting on the rounding). */
static BF16_TARGET float softmax_row(const float *scores, Py_ssize_t count, Py_ssize_t padded, uint16_t *probs)
{
    __m512 peak = _mm512_set1_ps(-INFINITY), total = _mm512_setzero_ps();
    for (Py_ssize_t j = 0; j < count; j += 16) {
        const __mmask16 valid = count - j >= 16 ? 0xFFFF : (__mmask16)((1u << (count - j)) - 1u);
        peak = _mm512_mask_max_ps(peak, valid, peak, _mm512_maskz_loadu_ps(valid, scores + j));
    }
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(peak));
    for (Py_ssize_t j = 0; j < padded; j += 16) {
        const __mmask16 valid = count - j >= 16 ? 0xFFFF : count > j ? (__mmask16)((1u << (count - j)) - 1u) : 0;
        const __m512 e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + j), top)));
        _mm256_storeu_si256((__m256i *)(probs + j), (__m256i)_mm512_cvtneps_pbh(e));
        total = _mm512_add_ps(total, e);
    }
    return 1.0f / _mm512_reduce_add_ps(total);
}

#define SCORE_CASE(n) case n: score_chunk(q_pairs, n, keys, padded, pairs, c, scores); break;
#define WEIGH_CASE(n, v) case n: weigh_values(probs32, n, padded / 2, key_pairs, values, head_dim, d0, v, inverse, out + t0 * row_stride, row_stride); break;
#define WEIGH_ROWS(v) switch (n) { WEIGH_CASE(1, v) WEIGH_CASE(2, v) WEIGH_CASE(3, v) WEIGH_CASE(4, v) WEIGH_CASE(5, v) WEIGH_CASE(6, v) }

/* `tokens` query rows (row_stride floats apart) of one head over one segment's laid-out keys/values. */
static BF16_TARGET void attend(const float *q, float *out, Py_ssize_t tokens, Py_ssize_t row_stride, const uint32_t *keys,
                               const uint32_t *values, Py_ssize_t padded, Py_ssize_t count, Py_ssize_t head_dim,
                               float scale, void *scratch)
{
    const Py_ssize_t pairs = head_dim / 2, key_pairs = (count + 1) / 2;
    uint32_t *q_pairs = scratch;
    float *scores = (float *)(q_pairs + ROWS * pairs);
    uint16_t *probs = (uint16_t *)(scores + ROWS * padded);
    const uint32_t *probs32 = (const uint32_t *)probs;
    for (Py_ssize_t t0 = 0; t0 < tokens; t0 += ROWS) {
        const int n = tokens - t0 < ROWS ? (int)(tokens - t0) : ROWS;
        for (int r = 0; r < n; r++) row_pairs(q + (t0 + r) * row_stride, scale, head_dim, q_pairs + r * pairs);
        for (Py_ssize_t c = 0; c < padded; c += CHUNK)
            switch (n) { SCORE_CASE(1) SCORE_CASE(2) SCORE_CASE(3) SCORE_CASE(4) SCORE_CASE(5) SCORE_CASE(6) }
        float inverse[ROWS];
        for (int r = 0; r < n; r++) inverse[r] = softmax_row(scores + r * padded, count, padded, probs + r * padded);
        for (Py_ssize_t d0 = 0; d0 < head_dim; d0 += DIMS) {
            switch ((head_dim - d0) / 16) {
            case 1: WEIGH_ROWS(1) break;
            case 2: WEIGH_ROWS(2) break;
            case 3: WEIGH_ROWS(3) break;
            default: WEIGH_ROWS(4)
            }
        }
    }
}

static void attend_task(void *ctx, Py_ssize_t index, int slot)
{
    struct job *job = ctx;
    const struct encoder_item *item = &job->items[index];
    const Py_ssize_t head_dim = job->head_dim, row = job->heads * head_dim, pairs = head_dim / 2;
    /* query pairs, float scores and bfloat16 probabilities of ROWS rows */
    void *scratch = fd_thread_scratch((size_t)ROWS * ((size_t)pairs * 4 + (size_t)job->longest * 6));
    if (scratch == NULL) {
        job->out_of_memory = 1;
        return;
    }
    const Py_ssize_t start = job->starts[item->segment], count = job->starts[item->segment + 1] - start;
    const Py_ssize_t padded = padded_length(count), offset = job->offsets[item->segment] + item->head * pairs * padded;
    const Py_ssize_t first = (start + item->token0) * row + item->head * head_dim;
    attend(encoder_query_rows(job->in) + first, job->out + first, item->tokens, row, job->keys + offset, job->values + offset, padded, count,
           head_dim, job->scale, scratch);
    (void)slot;
}

/* encoder_attention_bf16(q, k, v, (q, k, v offsets), stride, cos or None, sin or None, out, cu_seqlens, tokens,
 * heads, head_dim, scale, threads): encoder_attention's arguments (encoder_attention.c), no isa. */
PyObject *native_encoder_attention_bf16(PyObject *self, PyObject *args)
{
    PyObject *objects[5];
    Py_ssize_t offsets[3], stride;
    Py_buffer out, cu;
    Py_ssize_t tokens, heads, head_dim;
    double scale;
    int threads;
    if (!PyArg_ParseTuple(args, "OOO(nnn)nOOw*y*nnndi", &objects[0], &objects[1], &objects[2], &offsets[0],
                          &offsets[1], &offsets[2], &stride, &objects[3], &objects[4], &out, &cu, &tokens, &heads,
                          &head_dim, &scale, &threads))
        return NULL;
    PyObject *result = NULL;
    struct encoder_plan plan = {0};
    struct encoder_input in = {0};
    uint32_t *keys = NULL, *values = NULL;
    const Py_ssize_t segments = cu.len / (Py_ssize_t)sizeof(int64_t) - 1;
    const int64_t *starts = cu.buf;
    if (!native_cpu_has_bf16()) {
        PyErr_SetString(PyExc_ValueError, "encoder_attention_bf16: this CPU has no AVX512_BF16");
        goto done;
    }
    if (encoder_input_get(&in, objects, offsets, stride, tokens, heads, head_dim, row_kernels_avx512.rotary_row,
                          "encoder_attention_bf16") < 0)
        goto done;
    if (head_dim % 16 != 0 || head_dim > MAX_HEAD_DIM || out.len != tokens * heads * head_dim * (Py_ssize_t)sizeof(float) ||
        !encoder_segments_valid(starts, segments, tokens)) {
        PyErr_SetString(PyExc_ValueError, "encoder_attention_bf16: out does not match the shapes, head_dim is "
                                          "not a multiple of 16 up to 512, or cu_seqlens is not 0 .. tokens ascending");
        goto done;
    }
    if (encoder_plan_build(&plan, starts, segments, heads, head_dim / 2, padded_length) < 0) goto no_memory;
    /* not zeroed (calloc was 0.7% of a bfloat16 encode): padding keys' scores are never read (the
     * softmax masks them) and values are read up to the segment's last pair only */
    keys = PyMem_RawMalloc((size_t)(plan.laid_out > 0 ? plan.laid_out : 1) * sizeof(uint32_t));
    values = PyMem_RawMalloc((size_t)(plan.laid_out > 0 ? plan.laid_out : 1) * sizeof(uint32_t));
    if (keys == NULL || values == NULL) goto no_memory;
    struct job job = {
        .items = plan.items, .in = &in, .out = out.buf, .keys = keys, .values = values,
        .starts = starts, .offsets = plan.offsets, .heads = heads, .head_dim = head_dim, .longest = plan.longest,
        .scale = (float)scale,
    };
    Py_BEGIN_ALLOW_THREADS
    encoder_input_prepare(&in, tokens, head_dim, threads);
    fd_parallel_for(segments * heads, threads, layout_task, &job);
    fd_parallel_for(plan.count, threads, attend_task, &job);
    Py_END_ALLOW_THREADS
    if (job.out_of_memory) goto no_memory;
    result = Py_NewRef(Py_None);
    goto done;
no_memory:
    PyErr_NoMemory();
done:
    encoder_plan_free(&plan);
    encoder_input_release(&in);
    PyMem_RawFree(keys);
    PyMem_RawFree(values);
    PyBuffer_Release(&out);
    PyBuffer_Release(&cu);
    return result;
}
