/*
 * The `_native` extension module: the kernels' Python entry points.
 */
#include "blocks_int8.h"
#include "native.h"
#include "thread_adapt.h"

static PyObject *native_set_spin_us(PyObject *self, PyObject *args)
{
    double us;
    if (!PyArg_ParseTuple(args, "d", &us)) return NULL;
    if (!(us >= 0)) return PyErr_Format(PyExc_ValueError, "spin time must be >= 0 us, got %g", us);
    fd_set_spin_ns((long)(us * 1000.0));
    Py_RETURN_NONE;
}

static PyObject *native_spin_us(PyObject *self, PyObject *noargs) { return PyFloat_FromDouble(fd_spin_ns() / 1000.0); }

static PyObject *native_set_adaptive(PyObject *self, PyObject *args)
{
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    fd_set_adaptive(on);
    Py_RETURN_NONE;
}

static PyObject *native_set_step_shape(PyObject *self, PyObject *args)
{
    unsigned long long shape;
    if (!PyArg_ParseTuple(args, "K", &shape)) return NULL;
    fd_set_step_shape(shape);
    Py_RETURN_NONE;
}

static PyObject *native_adaptive_state(PyObject *self, PyObject *noargs)
{
    int adaptive, threads;
    long probes, switches;
    fd_adaptive_state(&adaptive, &threads, &probes, &switches);
    return Py_BuildValue("{sO,si,sl,sl}", "adaptive", adaptive ? Py_True : Py_False, "threads", threads, "probes",
                         probes, "switches", switches);
}

/* adapt_replay(kinds, costs): thread_adapt.c fed loop after loop, back to back: loop i is of kind
 * kinds[i] and takes costs[i][t - 1] ns on the t threads the policy picks (len(costs[i]) threads
 * asked for). Returns the threads picked for each loop: the policy's tests, without clocks. */
static PyObject *native_adapt_replay(PyObject *self, PyObject *args)
{
    PyObject *kinds, *costs;
    if (!PyArg_ParseTuple(args, "OO", &kinds, &costs)) return NULL;
    kinds = PySequence_Fast(kinds, "kinds must be a sequence of ints");
    if (kinds == NULL) return NULL;
    costs = PySequence_Fast(costs, "costs must be a sequence of sequences of ns");
    if (costs == NULL) {
        Py_DECREF(kinds);
        return NULL;
    }
    const Py_ssize_t loops = PySequence_Fast_GET_SIZE(kinds);
    PyObject *picked = loops == PySequence_Fast_GET_SIZE(costs) ? PyList_New(loops) : NULL;
    if (picked == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "kinds and costs must have one entry per loop");
    struct thread_adapt *a = picked ? PyMem_Calloc(1, sizeof(*a)) : NULL;
    if (picked && a == NULL) PyErr_NoMemory();
    if (a != NULL) adapt_init(a);
    long now = 1;
    for (Py_ssize_t i = 0; a != NULL && i < loops; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(costs, i);
        const Py_ssize_t limit = PySequence_Check(row) ? PySequence_Size(row) : -1;
        const unsigned long long kind = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(kinds, i));
        if (limit < 1 || PyErr_Occurred()) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "each loop needs a cost for 1.. threads");
            break;
        }
        const int threads = adapt_threads(a, (int)limit);
        PyObject *item = PySequence_GetItem(row, threads - 1);
        const double ns = item ? PyFloat_AsDouble(item) : -1.0;
        Py_XDECREF(item);
        if (PyErr_Occurred()) break;
        adapt_record(a, kind ? kind : 1, now, now + (long)ns);
        now += (long)ns;
        PyList_SET_ITEM(picked, i, PyLong_FromLong(threads));
    }
    PyMem_Free(a);
    Py_DECREF(kinds);
    Py_DECREF(costs);
    if (PyErr_Occurred()) {
        Py_XDECREF(picked);
        return NULL;
    }
    return picked;
}

static PyObject *native_has_vnni(PyObject *self, PyObject *noargs) { return PyBool_FromLong(native_cpu_has_vnni()); }

/* int8_dots(isa, widest): fd_int8_dots for an instruction set named by Python */
static PyObject *native_int8_dots(PyObject *self, PyObject *args)
{
    const char *isa_name;
    int widest;
    if (!PyArg_ParseTuple(args, "si", &isa_name, &widest)) return NULL;
    const int isa = native_isa_checked(isa_name);
    return isa < 0 ? NULL : PyLong_FromLong(fd_int8_dots(isa, widest));
}

/* int8_vbmi(allow): blocks_int8_rows_vbmi */
static PyObject *native_int8_vbmi(PyObject *self, PyObject *args)
{
    int allow;
    if (!PyArg_ParseTuple(args, "i", &allow)) return NULL;
    return PyBool_FromLong(blocks_int8_rows_vbmi(allow));
}

static PyMethodDef methods[] = {
    {"has_vnni", native_has_vnni, METH_NOARGS, "Whether the int8 kernels use AVX-512 VNNI on this CPU."},
    {"int8_dots", native_int8_dots, METH_VARARGS,
     "int8_dots(isa, widest): the sub-block int8 kernels' dots for isa (0 maddubs, 1 AVX-VNNI, 2 AVX-512 VNNI); "
     "widest 0..2 caps them from then on, -1 leaves them."},
    {"int8_vbmi", native_int8_vbmi, METH_VARARGS,
     "int8_vbmi(allow): whether the few-row int8 kernels use AVX512_VBMI here; allow 0/1 forbids/allows it, -1 leaves it."},
    {"best_isa", native_best_isa, METH_NOARGS, "The widest instruction set this CPU runs: avx512, avx2 or none."},
    {"attention", native_attention, METH_VARARGS, "Paged causal attention over block tables (see attention.c)."},
    {"attention_sink_factors", native_attention_sink_factors, METH_VARARGS,
     "Per query head, the factor that adds attention sinks to attention's output (see attention_sinks.c)."},
    {"encoder_attention", native_encoder_attention, METH_VARARGS,
     "Bidirectional attention within segments, no cache (see encoder_attention.c)."},
    {"attention_block", native_attention_block, METH_VARARGS,
     "A decoder layer's attention half in one call (see decoder_layer.c)."},
    {"mlp_block", native_mlp_block, METH_VARARGS, "A decoder layer's SwiGLU MLP half in one call (see decoder_layer.c)."},
    {"decoder_stack_prepare", native_decoder_stack_prepare, METH_O,
     "A run of decoder layers' halves and caches, parsed once for decoder_stack (see decoder_layer.c)."},
    {"decoder_stack", native_decoder_stack, METH_VARARGS, "A run of whole decoder layers in one call (see decoder_layer.c)."},
    {"rms_norm", native_rms_norm, METH_VARARGS, "RMSNorm of x (+ residual), row by row."},
    {"layer_norm", native_layer_norm, METH_VARARGS, "LayerNorm of x (+ residual), row by row, optional bias."},
    {"activation", native_activation, METH_VARARGS,
     "activation(kind, x, out, rows, cols, isa, threads): ACT_QUICK_GELU or ACT_GELU_ERF element-wise."},
    {"rotary", native_rotary, METH_VARARGS, "Rotate-half rotary embedding of [tokens, heads, head_dim]."},
    {"silu_and_mul", native_silu_and_mul, METH_VARARGS, "silu(gate) * up of [gate | up] rows."},
    {"set_adaptive", native_set_adaptive, METH_VARARGS,
     "set_adaptive(on): whether loops run on the thread count measured fastest lately (at most the one asked for)."},
    {"set_step_shape", native_set_step_shape, METH_VARARGS,
     "set_step_shape(shape): what the loops that follow belong to (the adaptive count compares like with like)."},
    {"adaptive_state", native_adaptive_state, METH_NOARGS,
     "The adaptive thread count's state: adaptive, threads (of the next loop; 0 before any), probes, switches."},
    {"adapt_replay", native_adapt_replay, METH_VARARGS,
     "adapt_replay(kinds, costs): the thread counts the adaptive policy picks for synthetic loop costs."},
    {"set_spin_us", native_set_spin_us, METH_VARARGS,
     "set_spin_us(us): how long the kernels' idle threads spin before they sleep."},
    {"spin_us", native_spin_us, METH_NOARGS, "How long the kernels' idle threads spin before they sleep, in us."},
    {"shm_collective", native_shm_collective, METH_VARARGS,
     "shm_collective(shm, x, out, rank, world, seq, slot_floats, timeout): sum x (out None) or gather it into out "
     "over the ranks mapping shm; the next seq."},
    {"packed_bytes", native_packed_bytes, METH_VARARGS,
     "packed_bytes(kind, out_features, in_features): the bytes of a packed weight of that kind and shape."},
    {"pack_blocks", native_pack_blocks, METH_VARARGS,
     "pack_blocks(kind, rows, out, out_features, in_features): GGUF rows into gemm's column panels."},
    {"gemm", native_gemm, METH_VARARGS,
     "gemm(kind, x, packed, out, rows, cols, depth, isa, threads): out = x @ dequant(packed).T"},
    {"has_bf16", native_has_bf16, METH_NOARGS, "Whether the bfloat16 products use AVX512_BF16 on this CPU."},
    {"round_bf16", native_round_bf16, METH_VARARGS, "round_bf16(x, out): float32 -> bfloat16 bits, to nearest even."},
    {"gemm_bf16", native_gemm_bf16, METH_VARARGS,
     "gemm_bf16(x, packed, out, rows, cols, depth, isa, threads, bias): bfloat16 product (see gemm_bf16.c)."},
    {"encoder_attention_bf16", native_encoder_attention_bf16, METH_VARARGS,
     "encoder_attention with bfloat16 products on AVX512_BF16 (see encoder_attention_bf16.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "Native cpu-backend kernels.", -1, methods};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "KIND_Q4_1", KIND_Q4_1) < 0 || PyModule_AddIntConstant(m, "KIND_Q8_0", KIND_Q8_0) < 0 ||
        PyModule_AddIntConstant(m, "KIND_F32", KIND_F32) < 0 ||
        PyModule_AddIntConstant(m, "KIND_BF16", KIND_BF16) < 0 ||
        PyModule_AddIntConstant(m, "KIND_W8A8", KIND_W8A8) < 0 || PyModule_AddIntConstant(m, "PANEL", PANEL) < 0 ||
        PyModule_AddIntConstant(m, "KIND_Q4_1_I8", KIND_Q4_1_I8) < 0 ||
        PyModule_AddIntConstant(m, "KIND_Q8_0_I8", KIND_Q8_0_I8) < 0 ||
        PyModule_AddIntConstant(m, "KIND_Q4_0", KIND_Q4_0) < 0 || PyModule_AddIntConstant(m, "KIND_Q5_0", KIND_Q5_0) < 0 ||
        PyModule_AddIntConstant(m, "KIND_Q5_1", KIND_Q5_1) < 0 || PyModule_AddIntConstant(m, "KIND_Q2_K", KIND_Q2_K) < 0 ||
        PyModule_AddIntConstant(m, "KIND_Q3_K", KIND_Q3_K) < 0 || PyModule_AddIntConstant(m, "KIND_Q4_K", KIND_Q4_K) < 0 ||
        PyModule_AddIntConstant(m, "KIND_Q5_K", KIND_Q5_K) < 0 || PyModule_AddIntConstant(m, "KIND_Q6_K", KIND_Q6_K) < 0 ||
        PyModule_AddIntConstant(m, "KIND_IQ4_NL", KIND_IQ4_NL) < 0 ||
        PyModule_AddIntConstant(m, "KIND_IQ4_XS", KIND_IQ4_XS) < 0 ||
        PyModule_AddIntConstant(m, "KIND_MIXED", KIND_MIXED) < 0 ||
        PyModule_AddIntConstant(m, "KIND_MXFP4", KIND_MXFP4) < 0 ||
        PyModule_AddIntConstant(m, "MIXED_HEADER_BYTES", MIXED_HEADER_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "MIXED_MAX_SEGMENTS", MIXED_MAX_SEGMENTS) < 0 ||
        PyModule_AddIntConstant(m, "ACT_QUICK_GELU", ACT_QUICK_GELU) < 0 ||
        PyModule_AddIntConstant(m, "ACT_GELU_ERF", ACT_GELU_ERF) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    /* the sub-block kinds' int8-activation twins, in the order of their float32 kinds */
    static const char *const i8_names[] = {"KIND_Q4_0_I8", "KIND_Q5_0_I8", "KIND_Q5_1_I8", "KIND_Q2_K_I8",
                                           "KIND_Q3_K_I8", "KIND_Q4_K_I8", "KIND_Q5_K_I8", "KIND_Q6_K_I8",
                                           "KIND_IQ4_NL_I8", "KIND_IQ4_XS_I8"};
    for (int i = 0; i <= KIND_IQ4_XS_I8 - KIND_Q4_0_I8; i++)
        if (PyModule_AddIntConstant(m, i8_names[i], KIND_Q4_0_I8 + i) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
