/*
 * The `_native` extension module: the kernels' Python entry points.
 */
#include "native.h"

static PyObject *native_set_spin_us(PyObject *self, PyObject *args)
{
    double us;
    if (!PyArg_ParseTuple(args, "d", &us)) return NULL;
    if (!(us >= 0)) return PyErr_Format(PyExc_ValueError, "spin time must be >= 0 us, got %g", us);
    fd_set_spin_ns((long)(us * 1000.0));
    Py_RETURN_NONE;
}

static PyObject *native_spin_us(PyObject *self, PyObject *noargs) { return PyFloat_FromDouble(fd_spin_ns() / 1000.0); }

static PyObject *native_has_vnni(PyObject *self, PyObject *noargs) { return PyBool_FromLong(native_cpu_has_vnni()); }

static PyMethodDef methods[] = {
    {"has_vnni", native_has_vnni, METH_NOARGS, "Whether the int8 kernels use AVX-512 VNNI on this CPU."},
    {"best_isa", native_best_isa, METH_NOARGS, "The widest instruction set this CPU runs: avx512, avx2 or none."},
    {"attention", native_attention, METH_VARARGS, "Paged causal attention over block tables (see attention.c)."},
    {"encoder_attention", native_encoder_attention, METH_VARARGS,
     "Bidirectional attention within segments, no cache (see encoder_attention.c)."},
    {"rms_norm", native_rms_norm, METH_VARARGS, "RMSNorm of x (+ residual), row by row."},
    {"rotary", native_rotary, METH_VARARGS, "Rotate-half rotary embedding of [tokens, heads, head_dim]."},
    {"silu_and_mul", native_silu_and_mul, METH_VARARGS, "silu(gate) * up of [gate | up] rows."},
    {"set_spin_us", native_set_spin_us, METH_VARARGS,
     "set_spin_us(us): how long the kernels' idle threads spin before they sleep."},
    {"spin_us", native_spin_us, METH_NOARGS, "How long the kernels' idle threads spin before they sleep, in us."},
    {"pack_blocks", native_pack_blocks, METH_VARARGS,
     "pack_blocks(kind, rows, out, out_features, in_features): GGUF rows into gemm's column panels."},
    {"gemm", native_gemm, METH_VARARGS,
     "gemm(kind, x, packed, out, rows, cols, depth, isa, threads): out = x @ dequant(packed).T"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "Native cpu-backend kernels.", -1, methods};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "KIND_Q4_1", KIND_Q4_1) < 0 || PyModule_AddIntConstant(m, "KIND_Q8_0", KIND_Q8_0) < 0 ||
        PyModule_AddIntConstant(m, "KIND_F32", KIND_F32) < 0 || PyModule_AddIntConstant(m, "PANEL", PANEL) < 0 ||
        PyModule_AddIntConstant(m, "KIND_Q4_1_I8", KIND_Q4_1_I8) < 0 ||
        PyModule_AddIntConstant(m, "KIND_Q8_0_I8", KIND_Q8_0_I8) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
