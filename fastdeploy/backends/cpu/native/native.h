/*
 * Shared declarations of the cpu backend's native kernels (the `_native` extension module).
 *
 * gemm.c         matrix products on GGUF Q4_1/Q8_0 blocks (dequantised in registers) and float32 panels
 * attention.c    paged causal attention over block tables
 * elementwise.c  RMSNorm (+ residual), SiLU-and-mul, rotary embedding
 * module.c       the Python module
 *
 * Every Python-facing function releases the GIL while it computes and splits its work over
 * `threads` OpenMP threads. The matmuls are compiled per instruction set with target attributes
 * and dispatched at run time; the other kernels are plain C compiled as `target_clones`.
 */
#ifndef FASTDEPLOY_NATIVE_H
#define FASTDEPLOY_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* One clone per instruction-set level; the dynamic loader picks the one this CPU runs. */
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

/* 16 floats, any alignment; GCC lowers arithmetic on it to whatever vectors the clone targets,
 * and keeps small constant-size arrays of it in registers. */
typedef float v16f __attribute__((vector_size(64), aligned(4)));

/* e^x for float32, vectorisable (the libm call is not): x = n ln2 + r, |r| <= ln2/2, and
 * e^r by its degree-7 Taylor polynomial (relative error below 2e-8 on that interval). */
static inline __attribute__((always_inline)) float exp_f32(float x)
{
    x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
    /* round to nearest by adding and removing 1.5 * 2^23 (vectorises, unlike rintf) */
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f; /* ln2 split in two for accuracy */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { float f; int32_t i; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

enum weight_kind { KIND_Q4_1 = 0, KIND_Q8_0 = 1, KIND_F32 = 2 };
#define PANEL 16 /* output columns per weight panel */

PyObject *native_best_isa(PyObject *self, PyObject *noargs);
PyObject *native_gemm(PyObject *self, PyObject *args);
PyObject *native_attention(PyObject *self, PyObject *args);
PyObject *native_rms_norm(PyObject *self, PyObject *args);
PyObject *native_silu_and_mul(PyObject *self, PyObject *args);
PyObject *native_rotary(PyObject *self, PyObject *args);

#endif
