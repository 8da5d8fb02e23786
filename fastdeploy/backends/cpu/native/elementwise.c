/*
 * The element-wise ops of a decoder layer: Python entry points running the instruction set's row
 * kernels (row_kernels.h), rows split over threads when there are many.
 */
#include "native.h"

/* rms_norm(x, residual or None, weight, eps, out, sum_out or None, rows, cols, isa, threads) */
PyObject *native_rms_norm(PyObject *self, PyObject *args)
{
    Py_buffer x, weight, out, residual = {0}, sum_out = {0};
    PyObject *residual_obj, *sum_obj;
    Py_ssize_t rows, cols;
    double eps;
    const char *isa;
    int threads;
    if (!PyArg_ParseTuple(args, "y*Oy*dw*Onnsi", &x, &residual_obj, &weight, &eps, &out, &sum_obj, &rows, &cols,
                          &isa, &threads))
        return NULL;
    PyObject *result = NULL;
    const int with_residual = residual_obj != Py_None;
    const struct row_kernels *kernels = native_row_kernels(isa);
    if (kernels == NULL) goto done;
    if (with_residual && (PyObject_GetBuffer(residual_obj, &residual, PyBUF_SIMPLE) < 0 ||
                          PyObject_GetBuffer(sum_obj, &sum_out, PyBUF_WRITABLE) < 0))
        goto done;
    const Py_ssize_t bytes = rows * cols * (Py_ssize_t)sizeof(float);
    if (x.len != bytes || out.len != bytes || weight.len != cols * (Py_ssize_t)sizeof(float) ||
        (with_residual && (residual.len != bytes || sum_out.len != bytes))) {
        PyErr_SetString(PyExc_ValueError, "rms_norm: buffer sizes do not match rows x cols");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (rows >= 64)
    for (Py_ssize_t r = 0; r < rows; r++)
        kernels->rms_norm_row((const float *)x.buf + r * cols, with_residual ? (const float *)residual.buf + r * cols : NULL,
                     weight.buf, (float *)out.buf + r * cols,
                     with_residual ? (float *)sum_out.buf + r * cols : NULL, cols, (float)eps);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&x);
    PyBuffer_Release(&weight);
    PyBuffer_Release(&out);
    if (residual.obj) PyBuffer_Release(&residual);
    if (sum_out.obj) PyBuffer_Release(&sum_out);
    return result;
}

/* silu_and_mul(x, out, rows, half, isa, threads): x [rows, 2*half] -> out [rows, half] */
PyObject *native_silu_and_mul(PyObject *self, PyObject *args)
{
    Py_buffer x, out;
    Py_ssize_t rows, half;
    const char *isa;
    int threads;
    if (!PyArg_ParseTuple(args, "y*w*nnsi", &x, &out, &rows, &half, &isa, &threads)) return NULL;
    PyObject *result = NULL;
    const struct row_kernels *kernels = native_row_kernels(isa);
    if (kernels == NULL) {
        /* native_row_kernels set the error */
    } else if (x.len != 2 * rows * half * (Py_ssize_t)sizeof(float) || out.len != rows * half * (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "silu_and_mul: buffer sizes do not match rows x half");
    } else {
        Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (rows >= 16)
        for (Py_ssize_t r = 0; r < rows; r++)
            kernels->silu_mul_row((const float *)x.buf + 2 * r * half, (float *)out.buf + r * half, half);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    return result;
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
        Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (tokens >= 64)
        for (Py_ssize_t t = 0; t < tokens; t++)
            kernels->rotary_row((const float *)x.buf + t * heads * head_dim, (float *)out.buf + t * heads * head_dim,
                       (const float *)cos.buf + pos[t] * half, (const float *)sin.buf + pos[t] * half, heads, head_dim,
                       half);
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
