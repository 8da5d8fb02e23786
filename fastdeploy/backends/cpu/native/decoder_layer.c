/*
 * A decoder layer in two native calls, its attention half and its MLP half (`Backend.attention_block`
 * and `Backend.mlp_block`), or a run of whole layers in one (`Backend.decoder_layers`).
 *
 * Why: op by op, a decode step of a small model is ~10 Python-to-C calls per layer, each converting
 * its arguments, allocating its output and starting its own thread loop (about 300 per token for
 * SmolLM2; a few percent of its decode on the 2-core EPYC). Here each half is one call: the GEMMs
 * and the attention still run on the thread pool, while the one-row ops of a decode step (norms,
 * rotary, SiLU) run inline. Between layers, Python still cost ~15 us a layer in the decode loop (its
 * code and data are out of the caches after each layer's weights streamed through them), so a
 * model's dense layers can also run as one call a step: `decoder_stack`, on the halves' weights and
 * caches parsed once (`decoder_stack_prepare`, a capsule).
 *
 * Each step runs the same kernels on the same data in the same order as the op-by-op path
 * (rms_norm_row, gemm.c, rotary_row, attention.c, silu_mul_row), so the results are bit-identical.
 *
 *   attention half: (x + residual) -> RMSNorm -> qkv GEMM (+ bias) -> per-head q/k RMSNorm (Qwen3) ->
 *                   rotary on q and k -> paged attention (writes k and v into the cache) -> o GEMM (+ bias)
 *   MLP half:       (x + residual) -> RMSNorm -> gate/up GEMM (+ bias) -> silu(gate) * up -> down GEMM (+ bias)
 */
#include "native.h"

#include <stdlib.h>
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
    /* non-NULL: the norm's (or SiLU's) rows also rounded here for the next product, a KIND_BF16 one,
     * while they are in cache (fd_bf16_row_pairs pairs a row) */
    uint16_t *rounded;
    Py_ssize_t rounded_pairs;
    /* non-NULL: ... or quantised here for `quantized_for`, an int8 product (fd_int8_quantize_rows) */
    void *quantized;
    const struct gemm_args *quantized_for;
    int isa;
};

static void norm_task(void *ctx, Py_ssize_t index, int slot)
{
    const struct layer_job *j = ctx;
    const Py_ssize_t end = (index + 1) * ROWS_PER_TASK < j->tokens ? (index + 1) * ROWS_PER_TASK : j->tokens;
    for (Py_ssize_t r = index * ROWS_PER_TASK; r < end; r++) {
        j->kernels->rms_norm_row(j->x + r * j->hidden, j->residual ? j->residual + r * j->hidden : NULL, j->norm,
                                 j->normed + r * j->hidden, j->residual ? j->sum_out + r * j->hidden : NULL,
                                 j->hidden, j->eps);
        if (j->rounded) fd_bf16_round_row(j->normed + r * j->hidden, j->rounded + r * j->rounded_pairs * 2, j->hidden);
    }
    if (j->quantized) fd_int8_quantize_rows(j->quantized_for, j->isa, j->quantized, index * ROWS_PER_TASK, end);
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
    for (Py_ssize_t r = index * ROWS_PER_TASK; r < end; r++) {
        j->kernels->silu_mul_row(j->gate_up + 2 * r * j->inner, j->act + r * j->inner, j->inner);
        if (j->rounded) fd_bf16_round_row(j->act + r * j->inner, j->rounded + r * j->rounded_pairs * 2, j->inner);
    }
    if (j->quantized) fd_int8_quantize_rows(j->quantized_for, j->isa, j->quantized, index * ROWS_PER_TASK, end);
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
    if (w->kind < KIND_Q4_1 || w->kind >= KINDS || (w->kind != KIND_F32 && w->kind != KIND_BF16 && depth % 32 != 0) ||
        !fd_packed_valid(w->kind, w->packed.buf, w->packed.len, cols, depth) ||
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

/* The row step before `next` (a norm or SiLU) also rounds its rows into `prepared` when `next` is a
 * KIND_BF16 product, or quantises them there when it is an int8 one of enough rows, where there is
 * such a buffer (decoder_stack's), which `next` then reads: the same rounding or quantisation the
 * product would do itself, without a pass (and a thread loop) over its activations out of cache. */
static void fuse_preparation(struct layer_job *job, struct gemm_args *next, void *prepared, int isa)
{
    const int rounds = prepared != NULL && next->kind == KIND_BF16;
    const int quantizes = prepared != NULL && !rounds && fd_int8_rows_bytes(next) > 0;
    job->rounded = rounds ? prepared : NULL;
    job->rounded_pairs = rounds ? fd_bf16_row_pairs(next->depth) : 0;
    next->x_bf16 = job->rounded;
    job->quantized = quantizes ? prepared : NULL;
    job->quantized_for = next;
    job->isa = isa;
    next->x_int8 = job->quantized;
}

/* `bytes` from a cache-line boundary (to free()), NULL when out of memory. Why: the scratch's rows
 * are whole cache lines (widths of 16 floats), so from an aligned start no vector load or store
 * straddles two lines and two threads' tasks (column strips of a product's output) share none.
 * malloc's 16-byte alignment cost a two-thread 512-token prefill 7% of its time (ERNIE-shaped
 * Q5_K_M and Q6_K, int8 activations, alternated in one process; one thread: within the noise). */
static void *aligned_scratch(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

/* A half's intermediate rows: `floats` per token; NULL with MemoryError set when out of memory. */
static float *token_rows(Py_ssize_t tokens, Py_ssize_t floats)
{
    float *rows = aligned_scratch((size_t)(tokens > 0 ? tokens : 1) * (size_t)floats * sizeof(float));
    if (rows == NULL) PyErr_NoMemory();
    return rows;
}

static void release(Py_buffer *buffers[], int count)
{
    for (int i = 0; i < count; i++)
        if (buffers[i]->obj) PyBuffer_Release(buffers[i]);
}

/* A decoder layer's attention half as the kernels take it: its weights and its KV cache. */
struct attention_half {
    Py_buffer norm, q_norm, k_norm, kc, vc, ks, vs;
    struct linear qkv, o;
    Py_ssize_t hidden, heads, kv_heads, head_dim;
    double eps, scale;
    int kv_type;
    Py_ssize_t window; /* > 0: sliding-window attention (struct paged_attention) */
    double softcap;    /* > 0: attention logit soft-capping (struct paged_attention) */
};

/* A decoder layer's SwiGLU half: gate_up [2 * inner, hidden] (gate rows first), down [hidden, inner]. */
struct mlp_half {
    Py_buffer norm;
    struct linear gate_up, down;
    Py_ssize_t hidden, inner;
    double eps;
};

/* What the layers of one pass share: positions, rotary tables, the batch's cache layout, the kernels. */
struct pass {
    Py_buffer positions, cos, sin, slots, starts, lens, tables;
    Py_ssize_t tokens, half, block_size, width;
    const struct row_kernels *kernels;
    int isa, threads;
};

static void release_attention_half(struct attention_half *h)
{
    Py_buffer *buffers[] = {&h->norm, &h->q_norm, &h->k_norm, &h->kc, &h->vc, &h->ks, &h->vs,
                            &h->qkv.packed, &h->qkv.bias, &h->o.packed, &h->o.bias};
    release(buffers, (int)(sizeof(buffers) / sizeof(buffers[0])));
}

static void release_mlp_half(struct mlp_half *m)
{
    Py_buffer *buffers[] = {&m->norm, &m->gate_up.packed, &m->gate_up.bias, &m->down.packed, &m->down.bias};
    release(buffers, (int)(sizeof(buffers) / sizeof(buffers[0])));
}

static void release_pass(struct pass *p)
{
    Py_buffer *buffers[] = {&p->positions, &p->cos, &p->sin, &p->slots, &p->starts, &p->lens, &p->tables};
    release(buffers, (int)(sizeof(buffers) / sizeof(buffers[0])));
}

static Py_ssize_t qkv_columns(const struct attention_half *h) { return (h->heads + 2 * h->kv_heads) * h->head_dim; }

/* An attention half from its (weights, cache) tuples (see attention_block); 0 with an error set when
 * they do not fit together. `h` starts zeroed; release it either way. */
static int parse_attention_half(PyObject *weights, PyObject *cache, struct attention_half *h)
{
    /* the groups are parsed one by one: CPython 3.11's argument parser sizes its cleanup list by the
     * top-level items only, and overruns it when nested tuples hold many buffers */
    if (!PyTuple_Check(weights) || !PyTuple_Check(cache)) {
        PyErr_SetString(PyExc_TypeError, "attention_block: weights and cache must be tuples");
        return 0;
    }
    if (!PyArg_ParseTuple(weights, "y*iy*z*z*z*iy*z*nnnndd|nd", &h->norm, &h->qkv.kind, &h->qkv.packed, &h->qkv.bias,
                          &h->q_norm, &h->k_norm, &h->o.kind, &h->o.packed, &h->o.bias, &h->hidden, &h->heads,
                          &h->kv_heads, &h->head_dim, &h->eps, &h->scale, &h->window, &h->softcap) ||
        !PyArg_ParseTuple(cache, "w*w*w*w*i", &h->kc, &h->vc, &h->ks, &h->vs, &h->kv_type))
        return 0;
    const Py_ssize_t float_bytes = (Py_ssize_t)sizeof(float);
    if (h->hidden <= 0 || h->heads <= 0 || h->kv_heads <= 0 || h->head_dim <= 0 ||
        h->norm.len != h->hidden * float_bytes || (h->q_norm.buf == NULL) != (h->k_norm.buf == NULL) ||
        (h->q_norm.buf != NULL && (h->q_norm.len != h->head_dim * float_bytes || h->k_norm.len != h->q_norm.len)) ||
        h->kc.len != h->vc.len || h->ks.len != h->vs.len) {
        PyErr_SetString(PyExc_ValueError, "attention_block: weight or cache sizes do not match the shapes");
        return 0;
    }
    return check_linear(&h->qkv, qkv_columns(h), h->hidden, "attention_block qkv") &&
           check_linear(&h->o, h->hidden, h->heads * h->head_dim, "attention_block o_proj");
}

/* An MLP half from its weights tuple (see mlp_block); as parse_attention_half. */
static int parse_mlp_half(PyObject *weights, struct mlp_half *m)
{
    if (!PyTuple_Check(weights)) {
        PyErr_SetString(PyExc_TypeError, "mlp_block: weights must be a tuple");
        return 0;
    }
    if (!PyArg_ParseTuple(weights, "y*iy*z*iy*z*nnd", &m->norm, &m->gate_up.kind, &m->gate_up.packed,
                          &m->gate_up.bias, &m->down.kind, &m->down.packed, &m->down.bias, &m->hidden, &m->inner,
                          &m->eps))
        return 0;
    if (m->hidden <= 0 || m->inner <= 0 || m->norm.len != m->hidden * (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "mlp_block: weight sizes do not match the shapes");
        return 0;
    }
    return check_linear(&m->gate_up, 2 * m->inner, m->hidden, "mlp_block gate_up") &&
           check_linear(&m->down, m->hidden, m->inner, "mlp_block down");
}

/* A pass from positions, cos, sin, half, the batch tuple (slot_mapping, query_starts, context_lens,
 * block_tables, block_size, table_width) and the kernels; 0 with an error set when they disagree. */
static int parse_pass(PyObject *args_positions, PyObject *args_cos, PyObject *args_sin, Py_ssize_t half,
                      PyObject *batch, const char *isa_str, int threads, struct pass *p)
{
    if (!PyTuple_Check(batch)) {
        PyErr_SetString(PyExc_TypeError, "the batch must be a tuple");
        return 0;
    }
    if (PyObject_GetBuffer(args_positions, &p->positions, PyBUF_SIMPLE) < 0 ||
        PyObject_GetBuffer(args_cos, &p->cos, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(args_sin, &p->sin, PyBUF_SIMPLE) < 0 ||
        !PyArg_ParseTuple(batch, "y*y*y*y*nn", &p->slots, &p->starts, &p->lens, &p->tables, &p->block_size, &p->width))
        return 0;
    p->kernels = native_row_kernels(isa_str);
    p->isa = p->kernels ? native_isa_checked(isa_str) : -1;
    if (p->isa < 0) return 0;
    p->threads = threads;
    p->half = half;
    p->tokens = p->positions.len / (Py_ssize_t)sizeof(int64_t);
    const Py_ssize_t index_bytes = (Py_ssize_t)sizeof(int64_t), float_bytes = (Py_ssize_t)sizeof(float);
    const Py_ssize_t table_rows = half > 0 ? p->cos.len / (half * float_bytes) : 0;
    int bad = half <= 0 || p->cos.len != p->sin.len || p->cos.len != table_rows * half * float_bytes ||
              p->starts.len < index_bytes || p->slots.len != p->positions.len ||
              p->tables.len != (p->starts.len / index_bytes - 1) * p->width * index_bytes ||
              p->lens.len != p->starts.len - index_bytes;
    const int64_t *position = p->positions.buf;
    for (Py_ssize_t t = 0; !bad && t < p->tokens; t++) bad = position[t] < 0 || position[t] >= table_rows;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "attention_block: buffer sizes, positions or shapes do not match");
        return 0;
    }
    return 1;
}

/* Floats of scratch an attention half needs: normed | qkv | q and the attention output | k, per token. */
static Py_ssize_t attention_scratch(const struct attention_half *h)
{
    return h->hidden + qkv_columns(h) + 2 * h->heads * h->head_dim + h->kv_heads * h->head_dim;
}

/* Floats of scratch an MLP half needs: normed | gate_up | act, per token. */
static Py_ssize_t mlp_scratch(const struct mlp_half *m) { return m->hidden + 3 * m->inner; }

/* The attention of one half for the pass, planned on `scratch` (where run_attention_half puts q, k
 * and the attention output); NULL with an error set when the cache and the batch disagree. */
static struct attention_job *plan_attention(const struct attention_half *h, const struct pass *p, float *scratch)
{
    const Py_ssize_t tokens = p->tokens, q_size = h->heads * h->head_dim, kv_size = h->kv_heads * h->head_dim;
    float *qkv = scratch + tokens * h->hidden, *q = qkv + tokens * qkv_columns(h), *attended = q + tokens * q_size;
    const struct paged_attention call = {
        .q = q, .k = attended + tokens * q_size, .v = qkv + q_size + kv_size, .k_stride = kv_size,
        .v_stride = qkv_columns(h), .out = attended, .key_cache = h->kc.buf, .value_cache = h->vc.buf,
        .key_scales = h->ks.buf, .value_scales = h->vs.buf, .cache_bytes = h->kc.len, .scale_bytes = h->ks.len,
        .slot_mapping = p->slots.buf, .query_starts = p->starts.buf, .context_lens = p->lens.buf,
        .block_tables = p->tables.buf, .seqs = p->lens.len / (Py_ssize_t)sizeof(int64_t), .tokens = tokens,
        .heads = h->heads, .kv_heads = h->kv_heads, .head_dim = h->head_dim, .block_size = p->block_size,
        .width = p->width, .scale = (float)h->scale, .kv_type = h->kv_type,
        .window = h->window > 0 ? h->window : 0, .softcap = h->softcap > 0.0 ? (float)h->softcap : 0.0f,
    };
    return paged_attention_plan(&call, p->kernels);
}

/* out = the half's output projection of x + residual's attention; sum_out = x + residual (residual
 * NULL: none, and sum_out unused). Runs without the GIL; -1 when out of memory. */
static int run_attention_half(const struct attention_half *h, const struct pass *p, struct attention_job *attention,
                              const float *x, const float *residual, float *out, float *sum_out, float *scratch,
                              void *prepared)
{
    const Py_ssize_t tokens = p->tokens, qkv_cols = qkv_columns(h), q_size = h->heads * h->head_dim;
    struct layer_job job = {
        .kernels = p->kernels, .tokens = tokens, .hidden = h->hidden, .eps = (float)h->eps, .x = x,
        .residual = residual, .norm = h->norm.buf, .normed = scratch, .sum_out = sum_out,
        .qkv = scratch + tokens * h->hidden, .q_norm = h->q_norm.buf, .k_norm = h->k_norm.buf, .cos = p->cos.buf,
        .sin = p->sin.buf, .positions = p->positions.buf, .qkv_cols = qkv_cols, .heads = h->heads,
        .kv_heads = h->kv_heads, .head_dim = h->head_dim, .half = p->half,
    };
    job.q = job.qkv + tokens * qkv_cols;
    float *attended = job.q + tokens * q_size;
    job.k = attended + tokens * q_size;
    struct gemm_args qkv_product = product(&h->qkv, job.normed, job.qkv, tokens, qkv_cols, h->hidden);
    const struct gemm_args o_product = product(&h->o, attended, out, tokens, h->hidden, q_size);
    fuse_preparation(&job, &qkv_product, prepared, p->isa);
    run_rows(&job, norm_task, p->threads);
    int failed = fd_gemm(&qkv_product, p->isa, p->threads);
    if (!failed) {
        run_rows(&job, rotary_task, p->threads);
        failed = paged_attention_run(attention, p->threads);
    }
    return failed ? failed : fd_gemm(&o_product, p->isa, p->threads);
}

/* out = the half's down projection of silu(gate) * up of x + residual; sum_out as run_attention_half. */
static int run_mlp_half(const struct mlp_half *m, const struct pass *p, const float *x, const float *residual,
                        float *out, float *sum_out, float *scratch, void *prepared)
{
    const Py_ssize_t tokens = p->tokens;
    struct layer_job job = {
        .kernels = p->kernels, .tokens = tokens, .hidden = m->hidden, .eps = (float)m->eps, .x = x,
        .residual = residual, .norm = m->norm.buf, .normed = scratch, .sum_out = sum_out,
        .gate_up = scratch + tokens * m->hidden, .act = scratch + tokens * (m->hidden + 2 * m->inner), .inner = m->inner,
    };
    struct gemm_args gate_up = product(&m->gate_up, job.normed, (float *)job.gate_up, tokens, 2 * m->inner, m->hidden);
    struct gemm_args down = product(&m->down, job.act, out, tokens, m->hidden, m->inner);
    fuse_preparation(&job, &gate_up, prepared, p->isa);
    run_rows(&job, norm_task, p->threads);
    int failed = fd_gemm(&gate_up, p->isa, p->threads);
    if (!failed) {
        fuse_preparation(&job, &down, prepared, p->isa); /* the same buffer: gate_up has read it */
        run_rows(&job, silu_task, p->threads);
        failed = fd_gemm(&down, p->isa, p->threads);
    }
    return failed;
}

/* x, residual (or None), out and sum_out (or None) of a call on [tokens, hidden] float32 rows. */
struct rows {
    Py_buffer x, out, residual, sum_out;
};

/* The rows of a call; tokens < 0: as many as x holds. A residual needs a sum_out (where x + residual
 * goes); every buffer given must have x's size. 0 with an error set when they do not fit. */
static int parse_rows(PyObject *x_obj, PyObject *residual_obj, PyObject *out_obj, PyObject *sum_obj, Py_ssize_t tokens,
                      Py_ssize_t hidden, struct rows *r)
{
    if (PyObject_GetBuffer(x_obj, &r->x, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(out_obj, &r->out, PyBUF_WRITABLE) < 0 ||
        (residual_obj != Py_None && PyObject_GetBuffer(residual_obj, &r->residual, PyBUF_SIMPLE) < 0) ||
        (sum_obj != Py_None && PyObject_GetBuffer(sum_obj, &r->sum_out, PyBUF_WRITABLE) < 0))
        return 0;
    const Py_ssize_t row_bytes = hidden * (Py_ssize_t)sizeof(float);
    const Py_ssize_t bytes = (tokens < 0 ? r->x.len / row_bytes : tokens) * row_bytes;
    if (r->x.len != bytes || r->out.len != bytes) {
        PyErr_SetString(PyExc_ValueError, "x and out must be [tokens, hidden] float32 rows");
        return 0;
    }
    if ((r->residual.obj != NULL && (r->sum_out.obj == NULL || r->residual.len != bytes)) ||
        (r->sum_out.obj != NULL && r->sum_out.len != bytes)) {
        PyErr_SetString(PyExc_ValueError, "residual and its sum must have x's shape");
        return 0;
    }
    return 1;
}

static void release_rows(struct rows *r)
{
    Py_buffer *buffers[] = {&r->x, &r->out, &r->residual, &r->sum_out};
    release(buffers, 4);
}

/* attention_block(x, residual or None, out, sum_out or None, positions, cos, sin, half,
 *     (input_norm, qkv_kind, qkv, qkv_bias or None, q_norm or None, k_norm or None, o_kind, o_proj, o_bias or None,
 *      hidden, heads, kv_heads, head_dim, eps, scale[, window[, softcap]]),
 *     (key_cache, value_cache, key_scales, value_scales, kv_type),
 *     (slot_mapping, query_starts, context_lens, block_tables, block_size, table_width), isa, threads)
 * x/out/residual/sum_out [tokens, hidden] float32, tokens = len(positions); the cache and batch arrays as
 * `attention` takes them (window and softcap too). out gets the o projection; sum_out x + residual. */
PyObject *native_attention_block(PyObject *self, PyObject *args)
{
    PyObject *x_obj, *residual_obj, *out_obj, *sum_obj, *positions, *cos, *sin, *weights, *cache, *batch, *result = NULL;
    Py_ssize_t half;
    const char *isa_str;
    int threads;
    struct attention_half h = {0};
    struct pass p = {0};
    struct rows r = {0};
    struct attention_job *attention = NULL;
    float *scratch = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOOOnOOOsi", &x_obj, &residual_obj, &out_obj, &sum_obj, &positions, &cos, &sin,
                          &half, &weights, &cache, &batch, &isa_str, &threads))
        return NULL;
    if (!parse_attention_half(weights, cache, &h) || !parse_pass(positions, cos, sin, half, batch, isa_str, threads, &p) ||
        !parse_rows(x_obj, residual_obj, out_obj, sum_obj, p.tokens, h.hidden, &r))
        goto done;
    if (2 * half > h.head_dim) {
        PyErr_SetString(PyExc_ValueError, "attention_block: the rotary tables are wider than a head");
        goto done;
    }
    scratch = token_rows(p.tokens, attention_scratch(&h));
    if (scratch == NULL || (attention = plan_attention(&h, &p, scratch)) == NULL) goto done;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = run_attention_half(&h, &p, attention, r.x.buf, r.residual.buf, r.out.buf, r.sum_out.buf, scratch, NULL);
    Py_END_ALLOW_THREADS
    result = failed ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    paged_attention_free(attention);
    free(scratch);
    release_attention_half(&h);
    release_pass(&p);
    release_rows(&r);
    return result;
}

/* mlp_block(x, residual or None, out, sum_out or None,
 *     (post_norm, gate_up_kind, gate_up, gate_up_bias or None, down_kind, down, down_bias or None, hidden, inner, eps),
 *     isa, threads)
 * x/out/residual/sum_out [tokens, hidden] float32; gate_up [2 * inner, hidden] (gate rows first), down
 * [hidden, inner]. out gets the down projection; sum_out x + residual. */
PyObject *native_mlp_block(PyObject *self, PyObject *args)
{
    PyObject *x_obj, *residual_obj, *out_obj, *sum_obj, *weights, *result = NULL;
    const char *isa_str;
    int threads;
    struct mlp_half m = {0};
    struct pass p = {0};
    struct rows r = {0};
    float *scratch = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOsi", &x_obj, &residual_obj, &out_obj, &sum_obj, &weights, &isa_str, &threads))
        return NULL;
    if (!parse_mlp_half(weights, &m)) goto done;
    p.kernels = native_row_kernels(isa_str);
    p.isa = p.kernels ? native_isa_checked(isa_str) : -1;
    p.threads = threads;
    if (p.isa < 0 || !parse_rows(x_obj, residual_obj, out_obj, sum_obj, -1, m.hidden, &r)) goto done;
    p.tokens = r.x.len / (m.hidden * (Py_ssize_t)sizeof(float));
    scratch = token_rows(p.tokens, mlp_scratch(&m));
    if (scratch == NULL) goto done;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = run_mlp_half(&m, &p, r.x.buf, r.residual.buf, r.out.buf, r.sum_out.buf, scratch, NULL);
    Py_END_ALLOW_THREADS
    result = failed ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    free(scratch);
    release_mlp_half(&m);
    release_rows(&r);
    return result;
}

/* ---------------------------------------------------------------- a run of layers in one call */

struct layer_halves {
    struct attention_half attention;
    struct mlp_half mlp;
};

struct stack {
    /* the scratch of the latest pass, kept for the next: a prompt pass's (tens of MB) would otherwise
     * be mapped afresh each time, its pages faulted in and zeroed by the kernel (~5% of a 2048-token
     * pass); `busy` while a call uses it (a concurrent call on the same stack takes its own) */
    float *scratch;
    size_t scratch_bytes;
    int busy;
    Py_ssize_t count;
    struct layer_halves layers[];
};

#define STACK_CAPSULE "fastdeploy.decoder_stack"

/* `floats` of scratch: the stack's own (grown when too small) unless another call holds it;
 * NULL with MemoryError set when out of memory. */
static float *stack_scratch(struct stack *stack, Py_ssize_t floats)
{
    if (__atomic_exchange_n(&stack->busy, 1, __ATOMIC_ACQUIRE)) return token_rows(1, floats);
    const size_t bytes = (size_t)floats * sizeof(float);
    if (stack->scratch_bytes < bytes) {
        free(stack->scratch);
        stack->scratch = aligned_scratch(bytes);
        stack->scratch_bytes = stack->scratch ? bytes : 0;
    }
    if (stack->scratch == NULL) {
        __atomic_store_n(&stack->busy, 0, __ATOMIC_RELEASE);
        PyErr_NoMemory();
    }
    return stack->scratch;
}

static void release_stack_scratch(struct stack *stack, float *scratch)
{
    if (scratch == NULL) return;
    if (scratch == stack->scratch)
        __atomic_store_n(&stack->busy, 0, __ATOMIC_RELEASE);
    else
        free(scratch);
}

static void free_stack(struct stack *stack)
{
    free(stack->scratch);
    for (Py_ssize_t i = 0; i < stack->count; i++) {
        release_attention_half(&stack->layers[i].attention);
        release_mlp_half(&stack->layers[i].mlp);
    }
    PyMem_RawFree(stack);
}

static void stack_capsule_destructor(PyObject *capsule)
{
    free_stack(PyCapsule_GetPointer(capsule, STACK_CAPSULE));
}

/* decoder_stack_prepare([(attention weights, cache, mlp weights), ...]) -> a capsule holding the layers'
 * halves parsed (each tuple as attention_block and mlp_block take it), for decoder_stack. */
PyObject *native_decoder_stack_prepare(PyObject *self, PyObject *layers)
{
    if (!PyList_Check(layers) || PyList_GET_SIZE(layers) == 0) {
        PyErr_SetString(PyExc_TypeError, "decoder_stack_prepare takes a non-empty list of layers");
        return NULL;
    }
    const Py_ssize_t count = PyList_GET_SIZE(layers);
    struct stack *stack = PyMem_RawCalloc(1, sizeof(struct stack) + (size_t)count * sizeof(struct layer_halves));
    if (stack == NULL) return PyErr_NoMemory();
    stack->count = count;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *layer = PyList_GET_ITEM(layers, i);
        PyObject *attention, *cache, *mlp;
        if (!PyArg_ParseTuple(layer, "O!O!O!", &PyTuple_Type, &attention, &PyTuple_Type, &cache, &PyTuple_Type, &mlp) ||
            !parse_attention_half(attention, cache, &stack->layers[i].attention) ||
            !parse_mlp_half(mlp, &stack->layers[i].mlp)) {
            free_stack(stack);
            return NULL;
        }
        if (stack->layers[i].mlp.hidden != stack->layers[i].attention.hidden ||
            stack->layers[i].attention.hidden != stack->layers[0].attention.hidden) {
            PyErr_Format(PyExc_ValueError,
                         "decoder_stack_prepare: layer %zd's attention half is %zd wide and its MLP half %zd; "
                         "layer 0 is %zd wide",
                         i, stack->layers[i].attention.hidden, stack->layers[i].mlp.hidden,
                         stack->layers[0].attention.hidden);
            free_stack(stack);
            return NULL;
        }
    }
    PyObject *capsule = PyCapsule_New(stack, STACK_CAPSULE, stack_capsule_destructor);
    if (capsule == NULL) free_stack(stack);
    return capsule;
}

/* Floats of the buffer where a pass's norms and SiLUs prepare the next product's activations: the
 * rounded rows of KIND_BF16 products (fd_bf16_row_pairs 32-bit pairs a row) or the quantised ones
 * of int8 products (fd_int8_rows_bytes), for the largest of a layer's qkv, gate_up and down. */
static Py_ssize_t prepared_floats(const struct stack *stack, Py_ssize_t tokens)
{
    Py_ssize_t floats = 0;
    for (Py_ssize_t i = 0; i < stack->count; i++) {
        const struct attention_half *a = &stack->layers[i].attention;
        const struct mlp_half *m = &stack->layers[i].mlp;
        const struct gemm_args next[3] = {
            product(&a->qkv, NULL, NULL, tokens, qkv_columns(a), a->hidden),
            product(&m->gate_up, NULL, NULL, tokens, 2 * m->inner, m->hidden),
            product(&m->down, NULL, NULL, tokens, m->hidden, m->inner),
        };
        for (int k = 0; k < 3; k++) {
            const Py_ssize_t need = next[k].kind == KIND_BF16 ? tokens * fd_bf16_row_pairs(next[k].depth)
                                                              : (Py_ssize_t)(fd_int8_rows_bytes(&next[k]) + 3) / 4;
            floats = need > floats ? need : floats;
        }
    }
    return floats;
}

/* decoder_stack(x, residual or None, out, sum_out, positions, cos, sin, half, stack, batch, isa, threads)
 * Every layer of `stack` (decoder_stack_prepare) in order, each its attention half then its MLP half,
 * exactly as attention_block and mlp_block run them: out gets the last layer's MLP output, sum_out the
 * residual stream after it. x/out/residual/sum_out [tokens, hidden] float32; the rest as attention_block. */
PyObject *native_decoder_stack(PyObject *self, PyObject *args)
{
    PyObject *x_obj, *residual_obj, *out_obj, *sum_obj, *positions, *cos, *sin, *capsule, *batch, *result = NULL;
    Py_ssize_t half;
    const char *isa_str;
    int threads;
    struct pass p = {0};
    struct rows r = {0};
    struct attention_job **plans = NULL;
    float *scratch = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOOOnOOsi", &x_obj, &residual_obj, &out_obj, &sum_obj, &positions, &cos, &sin,
                          &half, &capsule, &batch, &isa_str, &threads))
        return NULL;
    struct stack *stack = PyCapsule_GetPointer(capsule, STACK_CAPSULE);
    if (stack == NULL) return NULL;
    if (sum_obj == Py_None) {
        PyErr_SetString(PyExc_TypeError, "decoder_stack: sum_out is required (the residual stream it returns)");
        return NULL;
    }
    const Py_ssize_t hidden = stack->layers[0].attention.hidden, layers = stack->count;
    if (!parse_pass(positions, cos, sin, half, batch, isa_str, threads, &p)) goto done;
    /* with no residual, the first half's sum is x itself; sum_out is then written by the first MLP half */
    if (!parse_rows(x_obj, residual_obj, out_obj, sum_obj, p.tokens, hidden, &r)) goto done;
    Py_ssize_t floats = 0;
    for (Py_ssize_t i = 0; i < layers; i++) {
        const struct layer_halves *l = &stack->layers[i];
        if (2 * half > l->attention.head_dim) {
            PyErr_SetString(PyExc_ValueError, "decoder_stack: the rotary tables are wider than a head");
            goto done;
        }
        floats = attention_scratch(&l->attention) > floats ? attention_scratch(&l->attention) : floats;
        floats = mlp_scratch(&l->mlp) > floats ? mlp_scratch(&l->mlp) : floats;
    }
    /* the halves' scratch | attention outputs | MLP outputs | two residual sums, alternating by half |
     * the activations the norms and SiLUs prepare for the next product (prepared_floats) */
    const Py_ssize_t token_floats = (p.tokens > 0 ? p.tokens : 1) * (floats + 4 * hidden);
    const Py_ssize_t prepared = prepared_floats(stack, p.tokens);
    scratch = stack_scratch(stack, token_floats + prepared);
    plans = PyMem_RawCalloc((size_t)layers, sizeof(*plans));
    if (scratch == NULL || plans == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < layers; i++)
        if ((plans[i] = plan_attention(&stack->layers[i].attention, &p, scratch)) == NULL) goto done;
    float *attended = scratch + p.tokens * floats, *mlp_out = attended + p.tokens * hidden;
    float *sums[2] = {mlp_out + p.tokens * hidden, mlp_out + 2 * p.tokens * hidden};
    void *ready = prepared ? scratch + token_floats : NULL;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    const float *x = r.x.buf, *residual = r.residual.buf;
    for (Py_ssize_t i = 0; i < layers && !failed; i++) {
        const int last = i == layers - 1;
        float *attention_sum = residual ? sums[0] : NULL;
        failed = run_attention_half(&stack->layers[i].attention, &p, plans[i], x, residual, attended, attention_sum,
                                    scratch, ready);
        residual = residual ? attention_sum : x;
        float *mlp_sum = last ? (float *)r.sum_out.buf : sums[1];
        float *out = last ? (float *)r.out.buf : mlp_out;
        if (!failed)
            failed = run_mlp_half(&stack->layers[i].mlp, &p, attended, residual, out, mlp_sum, scratch, ready);
        x = out;
        residual = mlp_sum;
    }
    Py_END_ALLOW_THREADS
    result = failed ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; plans != NULL && i < layers; i++) paged_attention_free(plans[i]);
    PyMem_RawFree(plans);
    release_stack_scratch(stack, scratch);
    release_pass(&p);
    release_rows(&r);
    return result;
}
