"""Environment variables that configure fastdeploy, read in one place.

Each getter reads the environment when called, so tests and launchers can change a variable
before building an `LLM` without re-importing the package.
"""

from __future__ import annotations

import os


def log_dir() -> str:
    """Directory of `fastdeploy.log` (FastDeploy's `FD_LOG_DIR`, default `./log`)."""
    return os.environ.get("FD_LOG_DIR", "log")


def log_level() -> str:
    """Log level for fastdeploy's loggers (`FD_LOG_LEVEL`, default INFO)."""
    return os.environ.get("FD_LOG_LEVEL", "INFO").upper()


def enabled_plugins() -> list[str] | None:
    """Names of the third-party plugins to load (`FD_PLUGINS`, comma list); None means all."""
    value = os.environ.get("FD_PLUGINS")
    if value is None:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def device() -> str | None:
    """Device backend requested through `FD_DEVICE`, or None."""
    value = os.environ.get("FD_DEVICE", "").strip()
    return value or None


def cpu_threads() -> int | None:
    """Thread count for the cpu backend's kernels (`FD_CPU_THREADS`), or None for the cores the process may run on."""
    value = os.environ.get("FD_CPU_THREADS", "").strip()
    return int(value) if value else None


def cpu_kernels() -> str:
    """Kernels of the cpu backend (`FD_CPU_KERNELS`): auto, avx512, avx2 or numpy.

    auto: the native kernels on GGUF-quantised weights with the widest instruction set the CPU
    has, numpy where they are not built; numpy: dequantise every weight to float32 and use BLAS.
    """
    return os.environ.get("FD_CPU_KERNELS", "auto").strip().lower() or "auto"


def paddle_kernels() -> str:
    """Kernels of the Paddle backends (`FD_PADDLE_KERNELS`): auto, triton or reference.

    auto: Triton on a GPU when triton is installed, the paddle-op reference kernels otherwise
    (always on Paddle's CPU place, where Triton runs only under `TRITON_INTERPRET=1`).
    """
    return os.environ.get("FD_PADDLE_KERNELS", "auto").strip().lower() or "auto"
