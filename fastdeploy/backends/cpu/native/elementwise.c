/*
 * The element-wise ops of a decoder layer and of a vision encoder: Python entry points running the
 * instruction set's row kernels (row_kernels.h), rows split over threads when there are many.
 */
#include "native.h"

/* Rows per task: fewer rows than this run on the calling thread alone (waking workers would cost
 * more than the rows). */
#define ROWS_PER_TASK 32

/* One op's rows: fn runs rows [first, end) of it. */
struct rows_job {
    void (*fn)(const struct rows_job *job, Py_ssize_t first, Py_ssize_t end);
    const struct row_kernels *kernels;
    Py_ssize_t rows, cols;
    const float *x, *residual, *weight, *bias, *cos, *sin;
    float *out, *sum_out;
    const int64_t *positions;
    Py_ssize_t heads, half;
    float eps;
    int activation;
};

static void rows_task(void *ctx, Py_ssize_t index, int slot)
{
    const struct rows_job *job = ctx;
    const Py_ssize_t first = index * ROWS_PER_TASK;
    job->fn(job, first, first + ROWS_PER_TASK < job->rows ? first + ROWS_PER_TASK : job->rows);
    (void)slot;
}

static void run_rows(const struct rows_job *job, int threads)
{
    fd_parallel_for((job->rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK, threads, rows_task, (void *)job);
}

static void rms_norm_rows(const struct rows_job *job, Py_ssize_t first, Py_ssize_t end)
{
    const Py_ssize_t cols = job->cols;
    for (Py_ssize_t r = first; r < end; r++)
        job->kernels->rms_norm_row(job->x + r * cols, job->residual ? job->residual + r * cols : NULL, job->weight,
                                   job->out + r * cols, job->sum_out ? job->sum_out + r * cols : NULL, cols, job->eps);
}

static void layer_norm_rows(const struct rows_job *job, Py_ssize_t first, Py_ssize_t end)
{
    const Py_ssize_t cols = job->cols;
    for (Py_ssize_t r = first; r < end; r++)
        job->kernels->layer_norm_row(job->x + r * cols, job->residual ? job->residual + r * cols : NULL, job->weight,
                                     job->bias, job->out + r * cols, job->sum_out ? job->sum_out + r * cols : NULL,
                                     cols, job->eps);
}

static void activation_rows(const struct rows_job *job, Py_ssize_t first, Py_ssize_t end)
{
    job->kernels->activation_row[job->activation](job->x + first * job->cols, job->out + first * job->cols,
                                                  (end - first) * job->cols);
}

static void silu_mul_rows(const struct rows_job *job, Py_ssize_t first, Py_ssize_t end)
{
    for (Py_ssize_t r = first; r < end; r++)
        job->kernels->silu_mul_row(job->x + 2 * r * job->half, job->out + r * job->half, job->half);
}

static void rotary_rows(const struct rows_job *job, Py_ssize_t first, Py_ssize_t end)
{
    const Py_ssize_t row = job->heads * job->cols, half = job->half;
    for (Py_ssize_t t = first; t < end; t++)
        job->kernels->rotary_row(job->x + t * row, job->out + t * row, job->cos + job->positions[t] * half,
                                 job->sin + job->positions[t] * half, job->heads, job->cols, half);
}

/* rms_norm(x, residual or None, weight, eps, out, sum_out or None, rows, cols, isa, threads) and
 * layer_norm(x, residual or None, weight, bias or None, eps, out, sum_out or None, rows, cols, isa, threads) */
static PyObject *norm_entry(PyObject *args, int layer)
{
    Py_buffer x, weight, out, residual = {0}, sum_out = {0}, bias = {0};
    PyObject *residual_obj, *sum_obj, *bias_obj = Py_None;
    Py_ssize_t rows, cols;
    double eps;
    const char *isa;
    int threads;
    if (layer ? !PyArg_ParseTuple(args, "y*Oy*Odw*Onnsi", &x, &residual_obj, &weight, &bias_obj, &eps, &out,
                                  &sum_obj, &rows, &cols, &isa, &threads)
              : !PyArg_ParseTuple(args, "y*Oy*dw*Onnsi", &x, &residual_obj, &weight, &eps, &out, &sum_obj, &rows,
                                  &cols, &isa, &threads))
        return NULL;
    PyObject *result = NULL;
    const int with_residual = residual_obj != Py_None, with_bias = bias_obj != Py_None;
    const struct row_kernels *kernels = native_row_kernels(isa);
    if (kernels == NULL) goto done;
    if ((with_residual && (PyObject_GetBuffer(residual_obj, &residual, PyBUF_SIMPLE) < 0 ||
                           PyObject_GetBuffer(sum_obj, &sum_out, PyBUF_WRITABLE) < 0)) ||
        (with_bias && PyObject_GetBuffer(bias_obj, &bias, PyBUF_SIMPLE) < 0))
        goto done;
    const Py_ssize_t bytes = rows * cols * (Py_ssize_t)sizeof(float), row_bytes = cols * (Py_ssize_t)sizeof(float);
    if (x.len != bytes || out.len != bytes || weight.len != row_bytes || (with_bias && bias.len != row_bytes) ||
        (with_residual && (residual.len != bytes || sum_out.len != bytes))) {
        PyErr_Format(PyExc_ValueError, "%s: buffer sizes do not match rows x cols", layer ? "layer_norm" : "rms_norm");
        goto done;
    }
    const struct rows_job job = {
        .fn = layer ? layer_norm_rows : rms_norm_rows, .kernels = kernels, .rows = rows, .cols = cols, .x = x.buf,
        .residual = with_residual ? residual.buf : NULL, .weight = weight.buf, .bias = with_bias ? bias.buf : NULL,
        .out = out.buf, .sum_out = with_residual ? sum_out.buf : NULL, .eps = (float)eps,
    };
    Py_BEGIN_ALLOW_THREADS
    run_rows(&job, threads);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&x);
    PyBuffer_Release(&weight);
    PyBuffer_Release(&out);
    if (residual.obj) PyBuffer_Release(&residual);
    if (sum_out.obj) PyBuffer_Release(&sum_out);
    if (bias.obj) PyBuffer_Release(&bias);
    return result;
}

PyObject *native_rms_norm(PyObject *self, PyObject *args) { return norm_entry(args, 0); }

PyObject *native_layer_norm(PyObject *self, PyObject *args) { return norm_entry(args, 1); }

/* Runs `job` from x into out once their sizes are checked, then releases both buffers. */
static PyObject *run_x_to_out(struct rows_job *job, Py_buffer *x, Py_buffer *out, Py_ssize_t x_bytes,
                              Py_ssize_t out_bytes, const char *name, int threads)
{
    PyObject *result = NULL;
    if (job->kernels == NULL || PyErr_Occurred()) {
        /* native_row_kernels or the caller set the error */
    } else if (job->rows < 0 || x->len != x_bytes || out->len != out_bytes) {
        PyErr_Format(PyExc_ValueError, "%s: buffer sizes do not match the shape", name);
    } else {
        job->x = x->buf;
        job->out = out->buf;
        Py_BEGIN_ALLOW_THREADS
        run_rows(job, threads);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(x);
    PyBuffer_Release(out);
    return result;
}

/* activation(kind, x, out, rows, cols, isa, threads): out = f(x) element-wise (enum activation) */
PyObject *native_activation(PyObject *self, PyObject *args)
{
    Py_buffer x, out;
    Py_ssize_t rows, cols;
    const char *isa;
    int kind, threads;
    if (!PyArg_ParseTuple(args, "iy*w*nnsi", &kind, &x, &out, &rows, &cols, &isa, &threads)) return NULL;
    struct rows_job job = {.fn = activation_rows, .kernels = native_row_kernels(isa), .rows = rows, .cols = cols,
                           .activation = kind};
    if (job.kernels != NULL && (kind < 0 || kind >= ACTIVATIONS))
        PyErr_Format(PyExc_ValueError, "activation: unknown kind %d", kind);
    const Py_ssize_t bytes = rows * cols * (Py_ssize_t)sizeof(float);
    return run_x_to_out(&job, &x, &out, bytes, bytes, "activation", threads);
}

/* silu_and_mul(x, out, rows, half, isa, threads): x [rows, 2*half] -> out [rows, half] */
PyObject *native_silu_and_mul(PyObject *self, PyObject *args)
{
    Py_buffer x, out;
    Py_ssize_t rows, half;
    const char *isa;
    int threads;
    if (!PyArg_ParseTuple(args, "y*w*nnsi", &x, &out, &rows, &half, &isa, &threads)) return NULL;
    struct rows_job job = {.fn = silu_mul_rows, .kernels = native_row_kernels(isa), .rows = rows, .half = half};
    const Py_ssize_t bytes = rows * half * (Py_ssize_t)sizeof(float);
    return run_x_to_out(&job, &x, &out, 2 * bytes, bytes, "silu_and_mul", threads);
}

/* rotary(x, positions, cos, sin, out, tokens, heads, head_dim, half, isa, threads) */
PyObject *native_rotary(PyObject *self, PyObject *args)
{
    Py_buffer x, positions, cos, sin, out;
    Py_ssize_t tokens, heads, head_dim, half;
    const char *isa;
    int threads;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*nnnnsi", &x, &positions, &cos, &sin, &out, &tokens, &heads, &head_dim,
                          &half, &isa, &threads))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t bytes = tokens * heads * head_dim * (Py_ssize_t)sizeof(float);
    const Py_ssize_t table_rows = cos.len / (half > 0 ? half * (Py_ssize_t)sizeof(float) : 1);
    const int64_t *pos = positions.buf;
    int bad = x.len != bytes || out.len != bytes || positions.len != tokens * (Py_ssize_t)sizeof(int64_t) ||
              cos.len != sin.len || half <= 0 || 2 * half > head_dim;
    for (Py_ssize_t t = 0; !bad && t < tokens; t++) bad = pos[t] < 0 || pos[t] >= table_rows;
    const struct row_kernels *kernels = bad ? NULL : native_row_kernels(isa);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "rotary: buffer sizes or positions do not match the tables");
    } else if (kernels != NULL) {
        const struct rows_job job = {
            .fn = rotary_rows, .kernels = kernels, .rows = tokens, .cols = head_dim, .x = x.buf, .out = out.buf,
            .cos = cos.buf, .sin = sin.buf, .positions = pos, .heads = heads, .half = half,
        };
        Py_BEGIN_ALLOW_THREADS
        run_rows(&job, threads);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&cos);
    PyBuffer_Release(&sin);
    PyBuffer_Release(&out);
    return result;
}
