/*
 * Which instruction sets this CPU runs, and the checked choice of one by name.
 */
#include "native.h"

#include <string.h>

int native_cpu_isa(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return ISA_AVX2; /* every AVX2 x86 CPU also has F16C */
    return ISA_NONE;
}

const char *native_isa_name(int isa)
{
    return isa == ISA_AVX512 ? "avx512" : isa == ISA_AVX2 ? "avx2" : "none";
}

static int isa_from_name(const char *name)
{
    if (strcmp(name, "avx512") == 0) return ISA_AVX512;
    if (strcmp(name, "avx2") == 0) return ISA_AVX2;
    return -1;
}

int native_isa_checked(const char *name)
{
    const int isa = isa_from_name(name);
    if (isa < 0 || isa > native_cpu_isa()) {
        PyErr_Format(PyExc_ValueError, "instruction set %s is not available (this CPU: %s)", name,
                     native_isa_name(native_cpu_isa()));
        return -1;
    }
    return isa;
}

const struct row_kernels *native_row_kernels(const char *isa_name)
{
    const int isa = native_isa_checked(isa_name);
    return isa < 0 ? NULL : isa == ISA_AVX512 ? &row_kernels_avx512 : &row_kernels_avx2;
}

PyObject *native_best_isa(PyObject *self, PyObject *noargs)
{
    return PyUnicode_FromString(native_isa_name(native_cpu_isa()));
}

