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
            "threadpool",
            "thread_adapt",
            "gemm",
            "gemm_int8",
            "gemm_bf16",
            "gemm_w8a8",
            "packing",
            "block_packing",
            "gemm_blocks",
            "gemm_mixed",
            "gemm_blocks_avx2",
            "gemm_blocks_avx512",
            "gemm_blocks_int8",
            "gemm_blocks_int8_rows",
            "attention",
            "attention_sinks",
            "encoder_attention",
            "encoder_attention_bf16",
            "elementwise",
            "decoder_layer",
            "shm_collectives",
            "row_kernels_avx2",
            "row_kernels_avx512",
        )
    ],
    depends=[
        f"fastdeploy/backends/cpu/native/{name}.h"
        for name in (
            "native",
            "row_kernels",
            "attention_kernels",
            "thread_adapt",
            "blocks",
            "gemm_blocks",
            "block_quants",
            "blocks_int8",
        )
    ],
    # -fno-trapping-math: nothing here reads floating-point exception flags, and without it GCC will
    # not turn the float selects of the AVX2 kernels (exp's clamp) into vector blends. Results are
    # unchanged: it only drops the assumption that a comparison may trap.
    # -fopenmp-simd: the `omp simd` loop hints only; threads come from threadpool.c, not OpenMP.
    extra_compile_args=["-O3", "-fopenmp-simd", "-std=gnu11", "-fno-trapping-math", "-pthread"],
    extra_link_args=["-pthread"],
    optional=True,
)

x86_64 = platform.machine().lower() in ("x86_64", "amd64")
setup(ext_modules=[native_kernels] if x86_64 else [])
