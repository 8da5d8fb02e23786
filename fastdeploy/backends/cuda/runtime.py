"""Finds and imports paddlepaddle, and says precisely why a Paddle place cannot be used here.

`unavailable_reason` must be cheap (it runs for `fastdeploy env` and `device="auto"`), so it
reads installed distributions' metadata first and imports paddle only when a GPU build is
installed and the question is whether a GPU is visible.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from types import ModuleType

from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: distributions that provide the `paddle` module: the CPU build and the CUDA builds
CPU_DISTRIBUTION = "paddlepaddle"
GPU_DISTRIBUTIONS = ("paddlepaddle-gpu",)


def installed_paddle() -> tuple[str, str] | None:
    """(distribution, version) of the installed paddlepaddle build, GPU builds first, or None."""
    for name in (*GPU_DISTRIBUTIONS, CPU_DISTRIBUTION):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def import_paddle() -> ModuleType:
    """Import paddle with the settings it needs before import.

    Its bundled MKL skips the AVX2 kernels on AMD processors unless `MKL_DEBUG_CPU_TYPE=5` is set
    before the library loads (sgemm 25-35 -> 100-150 GFLOP/s measured here); an explicit value
    set by the user is kept. Import-time warnings (no ccache, ...) say nothing about inference.
    """
    os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import paddle
    return paddle


def paddle_unavailable_reason() -> str | None:
    """Why paddlepaddle cannot be used at all, or None."""
    if installed_paddle() is None:
        return "paddlepaddle is not installed (pip install paddlepaddle for CPU, paddlepaddle-gpu for CUDA)"
    return None


def gpu_unavailable_reason() -> str | None:
    """Why the cuda backend cannot run here (missing GPU build, no visible GPU), or None."""
    found = installed_paddle()
    if found is None:
        return "cuda backend needs paddlepaddle-gpu built with CUDA and a visible GPU; paddlepaddle is not installed"
    distribution, version = found
    if distribution == CPU_DISTRIBUTION:
        return (
            "cuda backend needs paddlepaddle-gpu built with CUDA and a visible GPU; "
            f"found paddlepaddle {version} (CPU build)"
        )
    try:
        paddle = import_paddle()
    except Exception as exc:  # a broken install must be reported, not crash `fastdeploy env`
        return f"cuda backend needs paddlepaddle-gpu; importing {distribution} {version} failed: {exc}"
    if not paddle.is_compiled_with_cuda():
        return (
            "cuda backend needs paddlepaddle-gpu built with CUDA and a visible GPU; "
            f"found {distribution} {version} built without CUDA"
        )
    if paddle.device.cuda.device_count() < 1:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return f"cuda backend found {distribution} {version} with CUDA but no visible GPU{hint}"
    return None


def set_cpu_threads(paddle: ModuleType, count: int) -> int:
    """Paddle's CPU math starts on one thread; give it `count`."""
    paddle.base.core.set_num_threads(count)
    return count
