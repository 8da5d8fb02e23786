"""Builds the cpu backend's native kernels; everything else is declared in pyproject.toml.

The extension is optional: where it cannot be compiled (no C compiler, not x86-64) the package
still installs and the cpu backend runs its numpy path instead.
"""

import platform

from setuptools import Extension, setup

native_kernels = Extension(
    "fastdeploy.backends.cpu.native._native",
    sources=[
        f"fastdeploy/backends/cpu/native/{name}.c"
        for name in (
            "module",
            "isa",
            "gemm",
            "attention",
            "elementwise",
            "row_kernels_avx2",
            "row_kernels_avx512",
        )
    ],
    depends=[f"fastdeploy/backends/cpu/native/{name}.h" for name in ("native", "row_kernels")],
    extra_compile_args=["-O3", "-fopenmp", "-std=gnu11"],
    extra_link_args=["-fopenmp"],
    optional=True,
)

x86_64 = platform.machine().lower() in ("x86_64", "amd64")
setup(ext_modules=[native_kernels] if x86_64 else [])
