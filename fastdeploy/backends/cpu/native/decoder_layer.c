/*
 * A decoder layer in two native calls: its attention half and its MLP half (`Backend.attention_block`
 * and `Backend.mlp_block`).
 *
 * Why: op by op, a decode step of a small model is ~10 Python-to-C calls per layer, each converting
 * its arguments, allocating its output and starting its own thread loop (about 300 per token for
 * SmolLM2; a few percent of its decode on the 2-core EPYC). Here each half is one call: the GEMMs
 * and the attention still run on the thread pool, while the one-row ops of a decode step (norms,
 * rotary, SiLU) run inline.
 *
 * Each step runs the same kernels on the same data in the same order as the op-by-op path
 * (rms_norm_row, gemm.c, rotary_row, attention.c, silu_mul_row), so the results are bit-identical.
 *
 *   attention half: (x + residual) -> RMSNorm -> qkv GEMM (+ bias) -> per-head q/k RMSNorm (Qwen3) ->
 *                   rotary on q and k -> paged attention (writes k and v into the cache) -> o GEMM (+ bias)
 *   MLP half:       (x + residual) -> RMSNorm -> gate/up GEMM (+ bias) -> silu(gate) * up -> down GEMM (+ bias)
 */
#include "native.h"

#include <string.h>

#define ROWS_PER_TASK 32 /* as elementwise.c: fewer rows run on the calling thread alone */

/* The work of both halves, row-wise steps included. */
struct layer_job {
    const struct row_kernels *kernels;
    Py_ssize_t tokens, hidden;
    float eps;
    /* the input norm */
    const float *x, *residual, *norm;
    float *normed, *sum_out;
    /* attention: per-head norms and rotary from `qkv` into q/k */
    float *qkv, *q, *k;
    const float *q_norm, *k_norm, *cos, *sin;
    const int64_t *positions;
    Py_ssize_t qkv_cols, heads, kv_heads, head_dim, half;
    /* MLP: silu(gate) * up of `gate_up` into `act` */
    const float *gate_up;
    float *act;
    Py_ssize_t inner;
};

static void norm_task(void *ctx, Py_ssize_t index, int slot)
{
    const struct layer_job *j = ctx;
    const Py_ssize_t end = (index + 1) * ROWS_PER_TASK < j->tokens ? (index + 1) * ROWS_PER_TASK : j->tokens;
    for (Py_ssize_t r = index * ROWS_PER_TASK; r < end; r++)
        j->kernels->rms_norm_row(j->x + r * j->hidden, j->residual ? j->residual + r * j->hidden : NULL, j->norm,
                                 j->normed + r * j->hidden, j->residual ? j->sum_out + r * j->hidden : NULL,
                                 j->hidden, j->eps);
    (void)slot;
}

/* Per-head RMSNorm of `heads` heads in place, as `rms_norm` of [tokens * heads, head_dim] rows. */
static void head_norms(const struct layer_job *j, float *x, Py_ssize_t heads, const float *weight)
{
    for (Py_ssize_t h = 0; h < heads; h++)
        j->kernels->rms_norm_row(x + h * j->head_dim, NULL, weight, x + h * j->head_dim, NULL, j->head_dim, j->eps);
}

static void rotary_task(void *ctx, Py_ssize_t index, int slot)
{
    const struct layer_job *j = ctx;
    const Py_ssize_t end = (index + 1) * ROWS_PER_TASK < j->tokens ? (index + 1) * ROWS_PER_TASK : j->tokens;
    const Py_ssize_t q_size = j->heads * j->head_dim, kv_size = j->kv_heads * j->head_dim;
    for (Py_ssize_t t = index * ROWS_PER_TASK; t < end; t++) {
        float *row = j->qkv + t * j->qkv_cols;
        if (j->q_norm) {
            head_norms(j, row, j->heads, j->q_norm);
            head_norms(j, row + q_size, j->kv_heads, j->k_norm);
        }
        const float *cos_row = j->cos + j->positions[t] * j->half, *sin_row = j->sin + j->positions[t] * j->half;
        j->kernels->rotary_row(row, j->q + t * q_size, cos_row, sin_row, j->heads, j->head_dim, j->half);
        j->kernels->rotary_row(row + q_size, j->k + t * kv_size, cos_row, sin_row, j->kv_heads, j->head_dim, j->half);
    }
    (void)slot;
}

static void silu_task(void *ctx, Py_ssize_t index, int slot)
{
    const struct layer_job *j = ctx;
    const Py_ssize_t end = (index + 1) * ROWS_PER_TASK < j->tokens ? (index + 1) * ROWS_PER_TASK : j->tokens;
    for (Py_ssize_t r = index * ROWS_PER_TASK; r < end; r++)
        j->kernels->silu_mul_row(j->gate_up + 2 * r * j->inner, j->act + r * j->inner, j->inner);
    (void)slot;
}

static void run_rows(struct layer_job *j, fd_task_fn fn, int threads)
{
    fd_parallel_for((j->tokens + ROWS_PER_TASK - 1) / ROWS_PER_TASK, threads, fn, j);
}

/* A packed linear weight: its kind and blocks, and the bias (NULL buffer: none). */
struct linear {
    int kind;
    Py_buffer packed, bias;
};

/* Whether `w` is a valid [cols, depth] weight (and [cols] bias); sets a ValueError naming it if not. */
static int check_linear(const struct linear *w, Py_ssize_t cols, Py_ssize_t depth, const char *name)
{
    if (w->kind < KIND_Q4_1 || w->kind > KIND_Q8_0_I8 || (w->kind != KIND_F32 && depth % 32 != 0) ||
        w->packed.len != fd_packed_bytes(w->kind, cols, depth) ||
        (w->bias.buf != NULL && w->bias.len != cols * (Py_ssize_t)sizeof(float))) {
        PyErr_Format(PyExc_ValueError, "%s: a packed [%zd, %zd] weight (kind %d) and bias do not match their buffers",
                     name, cols, depth, w->kind);
        return 0;
    }
    return 1;
}

static struct gemm_args product(const struct linear *w, const float *x, float *out, Py_ssize_t rows, Py_ssize_t cols,
                                Py_ssize_t depth)
{
    return (struct gemm_args){x, w->packed.buf, out, rows, cols, depth, w->kind, w->bias.buf};
}

/* The residual input of a half: None, or a buffer whose sum with x goes to `sum_out`. Returns 0 with
 * an error set when they do not match x. */
static int get_residual(PyObject *residual_obj, PyObject *sum_obj, Py_buffer *residual, Py_buffer *sum_out,
                        Py_ssize_t bytes)
{
    if (residual_obj == Py_None) return 1;
    if (PyObject_GetBuffer(residual_obj, residual, PyBUF_SIMPLE) < 0) return 0;
    if (PyObject_GetBuffer(sum_obj, sum_out, PyBUF_WRITABLE) < 0) return 0;
    if (residual->len != bytes || sum_out->len != bytes) {
        PyErr_SetString(PyExc_ValueError, "residual and its sum must have x's shape");
        return 0;
    }
    return 1;
}

/* A half's intermediate rows: `floats` per token; NULL with MemoryError set when out of memory. */
static float *token_rows(Py_ssize_t tokens, Py_ssize_t floats)
{
    float *rows = PyMem_RawMalloc((size_t)(tokens > 0 ? tokens : 1) * (size_t)floats * sizeof(float));
    if (rows == NULL) PyErr_NoMemory();
    return rows;
}

static void release(Py_buffer *buffers[], int count)
{
    for (int i = 0; i < count; i++)
        if (buffers[i]->obj) PyBuffer_Release(buffers[i]);
}

/* attention_block(x, residual or None, out, sum_out or None, positions, cos, sin, half,
 *     (input_norm, qkv_kind, qkv, qkv_bias or None, q_norm or None, k_norm or None, o_kind, o_proj, o_bias or None,
 *      hidden, heads, kv_heads, head_dim, eps, scale),
 *     (key_cache, value_cache, key_scales, value_scales, kv_type),
 *     (slot_mapping, query_starts, context_lens, block_tables, block_size, table_width), isa, threads)
 * x/out/residual/sum_out [tokens, hidden] float32, tokens = len(positions); the cache and batch arrays as
 * `attention` takes them. out gets the o projection; sum_out x + residual. */
PyObject *native_attention_block(PyObject *self, PyObject *args)
{
    Py_buffer x = {0}, out = {0}, residual = {0}, sum_out = {0}, positions = {0}, norm = {0}, q_norm = {0},
              k_norm = {0}, cos = {0}, sin = {0}, kc = {0}, vc = {0}, ks = {0}, vs = {0}, slots = {0}, starts = {0},
              lens = {0}, tables = {0};
    struct linear qkv = {0}, o = {0};
    Py_buffer *buffers[] = {&x, &out, &residual, &sum_out, &positions, &norm, &q_norm, &k_norm, &cos, &sin,
                            &kc, &vc, &ks, &vs, &slots, &starts, &lens, &tables, &qkv.packed, &qkv.bias,
                            &o.packed, &o.bias};
    PyObject *residual_obj, *sum_obj, *weights, *cache, *batch, *result = NULL;
    struct attention_job *attention = NULL;
    float *scratch = NULL;
    Py_ssize_t hidden, heads, kv_heads, head_dim, half, block_size, width;
    double eps, scale;
    int kv_type, threads;
    const char *isa_str;
    /* the groups are parsed one by one: CPython 3.11's argument parser sizes its cleanup list by the
     * top-level items only, and overruns it when nested tuples hold many buffers */
    if (!PyArg_ParseTuple(args, "y*Ow*Oy*y*y*nO!O!O!si", &x, &residual_obj, &out, &sum_obj, &positions, &cos, &sin,
                          &half, &PyTuple_Type, &weights, &PyTuple_Type, &cache, &PyTuple_Type, &batch, &isa_str,
                          &threads))
        return NULL;
    if (!PyArg_ParseTuple(weights, "y*iy*z*z*z*iy*z*nnnndd", &norm, &qkv.kind, &qkv.packed, &qkv.bias, &q_norm,
                          &k_norm, &o.kind, &o.packed, &o.bias, &hidden, &heads, &kv_heads, &head_dim, &eps, &scale) ||
        !PyArg_ParseTuple(cache, "w*w*w*w*i", &kc, &vc, &ks, &vs, &kv_type) ||
        !PyArg_ParseTuple(batch, "y*y*y*y*nn", &slots, &starts, &lens, &tables, &block_size, &width))
        goto done;
    const struct row_kernels *kernels = native_row_kernels(isa_str);
    const int isa = kernels ? native_isa_checked(isa_str) : -1;
    const Py_ssize_t tokens = positions.len / (Py_ssize_t)sizeof(int64_t);
    const Py_ssize_t float_bytes = (Py_ssize_t)sizeof(float), rows_bytes = tokens * hidden * float_bytes;
    const Py_ssize_t q_size = heads * head_dim, kv_size = kv_heads * head_dim, qkv_cols = q_size + 2 * kv_size;
    if (isa < 0 || !get_residual(residual_obj, sum_obj, &residual, &sum_out, rows_bytes)) goto done;
    const int64_t *position = positions.buf;
    const Py_ssize_t table_rows = half > 0 ? cos.len / (half * float_bytes) : 0;
    int bad = hidden <= 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0 || half <= 0 || 2 * half > head_dim ||
              x.len != rows_bytes || out.len != rows_bytes || norm.len != hidden * float_bytes ||
              cos.len != sin.len || cos.len != table_rows * half * float_bytes ||
              (q_norm.buf == NULL) != (k_norm.buf == NULL) ||
              (q_norm.buf != NULL && (q_norm.len != head_dim * float_bytes || k_norm.len != q_norm.len)) ||
              starts.len < (Py_ssize_t)sizeof(int64_t) || slots.len != positions.len ||
              tables.len != (starts.len / (Py_ssize_t)sizeof(int64_t) - 1) * width * (Py_ssize_t)sizeof(int64_t) ||
              lens.len != starts.len - (Py_ssize_t)sizeof(int64_t) || kc.len != vc.len || ks.len != vs.len;
    for (Py_ssize_t t = 0; !bad && t < tokens; t++) bad = position[t] < 0 || position[t] >= table_rows;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "attention_block: buffer sizes, positions or shapes do not match");
        goto done;
    }
    if (!check_linear(&qkv, qkv_cols, hidden, "attention_block qkv") ||
        !check_linear(&o, hidden, q_size, "attention_block o_proj"))
        goto done;
    /* normed [tokens, hidden] | qkv [tokens, qkv_cols] | q and attention output [tokens, q_size] | k [tokens, kv_size] */
    scratch = token_rows(tokens, hidden + qkv_cols + 2 * q_size + kv_size);
    if (scratch == NULL) goto done;
    struct layer_job job = {
        .kernels = kernels, .tokens = tokens, .hidden = hidden, .eps = (float)eps, .x = x.buf,
        .residual = residual.buf, .norm = norm.buf, .normed = scratch, .sum_out = sum_out.buf,
        .qkv = scratch + tokens * hidden, .q_norm = q_norm.buf, .k_norm = k_norm.buf, .cos = cos.buf, .sin = sin.buf,
        .positions = position, .qkv_cols = qkv_cols, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim,
        .half = half,
    };
    job.q = job.qkv + tokens * qkv_cols;
    float *attended = job.q + tokens * q_size;
    job.k = attended + tokens * q_size;
    const struct paged_attention call = {
        .q = job.q, .k = job.k, .v = job.qkv + q_size + kv_size, .k_stride = kv_size, .v_stride = qkv_cols, .out = attended,
        .key_cache = kc.buf, .value_cache = vc.buf, .key_scales = ks.buf, .value_scales = vs.buf,
        .cache_bytes = kc.len, .scale_bytes = ks.len, .slot_mapping = slots.buf, .query_starts = starts.buf,
        .context_lens = lens.buf, .block_tables = tables.buf, .seqs = lens.len / (Py_ssize_t)sizeof(int64_t),
        .tokens = tokens, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim, .block_size = block_size,
        .width = width, .scale = (float)scale, .kv_type = kv_type,
    };
    attention = paged_attention_plan(&call, kernels);
    if (attention == NULL) goto done;
    const struct gemm_args qkv_product = product(&qkv, job.normed, job.qkv, tokens, qkv_cols, hidden);
    const struct gemm_args o_product = product(&o, attended, out.buf, tokens, hidden, q_size);
    int failed;
    Py_BEGIN_ALLOW_THREADS
    run_rows(&job, norm_task, threads);
    failed = fd_gemm(&qkv_product, isa, threads);
    if (!failed) {
        run_rows(&job, rotary_task, threads);
        failed = paged_attention_run(attention, threads);
    }
    if (!failed) failed = fd_gemm(&o_product, isa, threads);
    Py_END_ALLOW_THREADS
    result = failed ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    paged_attention_free(attention);
    PyMem_RawFree(scratch);
    release(buffers, (int)(sizeof(buffers) / sizeof(buffers[0])));
    return result;
}

/* mlp_block(x, residual or None, out, sum_out or None,
 *     (post_norm, gate_up_kind, gate_up, gate_up_bias or None, down_kind, down, down_bias or None, hidden, inner, eps),
 *     isa, threads)
 * x/out/residual/sum_out [tokens, hidden] float32; gate_up [2 * inner, hidden] (gate rows first), down
 * [hidden, inner]. out gets the down projection; sum_out x + residual. */
PyObject *native_mlp_block(PyObject *self, PyObject *args)
{
    Py_buffer x = {0}, out = {0}, residual = {0}, sum_out = {0}, norm = {0};
    struct linear gate_up = {0}, down = {0};
    Py_buffer *buffers[] = {&x, &out, &residual, &sum_out, &norm, &gate_up.packed, &gate_up.bias, &down.packed,
                            &down.bias};
    PyObject *residual_obj, *sum_obj, *weights, *result = NULL;
    float *scratch = NULL;
    Py_ssize_t hidden, inner;
    double eps;
    int threads;
    const char *isa_str;
    if (!PyArg_ParseTuple(args, "y*Ow*OO!si", &x, &residual_obj, &out, &sum_obj, &PyTuple_Type, &weights, &isa_str,
                          &threads))
        return NULL;
    if (!PyArg_ParseTuple(weights, "y*iy*z*iy*z*nnd", &norm, &gate_up.kind, &gate_up.packed, &gate_up.bias,
                          &down.kind, &down.packed, &down.bias, &hidden, &inner, &eps))
        goto done;
    const struct row_kernels *kernels = native_row_kernels(isa_str);
    const int isa = kernels ? native_isa_checked(isa_str) : -1;
    const Py_ssize_t float_bytes = (Py_ssize_t)sizeof(float);
    const Py_ssize_t tokens = hidden > 0 ? x.len / (hidden * float_bytes) : 0;
    if (isa < 0 || !get_residual(residual_obj, sum_obj, &residual, &sum_out, x.len)) goto done;
    if (hidden <= 0 || inner <= 0 || x.len != tokens * hidden * float_bytes || out.len != x.len ||
        norm.len != hidden * float_bytes) {
        PyErr_SetString(PyExc_ValueError, "mlp_block: buffer sizes do not match the shapes");
        goto done;
    }
    if (!check_linear(&gate_up, 2 * inner, hidden, "mlp_block gate_up") ||
        !check_linear(&down, hidden, inner, "mlp_block down"))
        goto done;
    /* normed [tokens, hidden] | gate_up [tokens, 2 * inner] | act [tokens, inner] */
    scratch = token_rows(tokens, hidden + 3 * inner);
    if (scratch == NULL) goto done;
    struct layer_job job = {
        .kernels = kernels, .tokens = tokens, .hidden = hidden, .eps = (float)eps, .x = x.buf,
        .residual = residual.buf, .norm = norm.buf, .normed = scratch, .sum_out = sum_out.buf,
        .gate_up = scratch + tokens * hidden, .act = scratch + tokens * (hidden + 2 * inner), .inner = inner,
    };
    const struct gemm_args gate_up_product = product(&gate_up, job.normed, (float *)job.gate_up, tokens, 2 * inner, hidden);
    const struct gemm_args down_product = product(&down, job.act, out.buf, tokens, hidden, inner);
    int failed;
    Py_BEGIN_ALLOW_THREADS
    run_rows(&job, norm_task, threads);
    failed = fd_gemm(&gate_up_product, isa, threads);
    if (!failed) {
        run_rows(&job, silu_task, threads);
        failed = fd_gemm(&down_product, isa, threads);
    }
    Py_END_ALLOW_THREADS
    result = failed ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    PyMem_RawFree(scratch);
    release(buffers, (int)(sizeof(buffers) / sizeof(buffers[0])));
    return result;
}
