"""Chooses between the Triton kernels and the reference kernels, and launches Triton.

On a GPU the Triton kernels run compiled. On a CPU place (`paddle-cpu`, `torch-cpu`) Triton
runs only in its interpreter (`TRITON_INTERPRET=1`, which needs torch tensors), so there the
default is the reference kernels and `FD_CUDA_KERNELS=triton` opts into the interpreter: slow,
but it runs the exact launch code the GPU runs.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from fastdeploy import envs
from fastdeploy.backends.cuda.runtimes.base import TensorRuntime
from fastdeploy.backends.cuda.shared_memory import LARGE_SHARED_MEMORY, device_shared_memory
from fastdeploy.errors import BackendUnavailableError, InvalidArgumentError
from fastdeploy.logger import get_logger

logger = get_logger(__name__)
KERNEL_CHOICES = ("auto", "triton", "reference")
#: `LARGE_SHARED_MEMORY` and `device_shared_memory` live in `shared_memory` (the kernels read
#: them there) and are re-exported here for callers of the launcher
__all__ = [
    "KERNEL_CHOICES",
    "LARGE_SHARED_MEMORY",
    "TritonLauncher",
    "choose_kernels",
    "device_shared_memory",
    "triton_interpreter_enabled",
    "triton_unavailable_reason",
]


def triton_interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def triton_unavailable_reason(on_gpu: bool) -> str | None:
    """Why the Triton kernels cannot run on this place, or None."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton)"
    if not on_gpu:
        if not triton_interpreter_enabled():
            return "Triton kernels run on a CPU place only under TRITON_INTERPRET=1"
        if importlib.util.find_spec("torch") is None:
            return "Triton's interpreter needs torch (pip install torch)"
    return None


def choose_kernels(on_gpu: bool, requested: str | None = None) -> str:
    """'triton' or 'reference' for FD_CUDA_KERNELS (or `requested`) on this place."""
    choice = (requested or envs.cuda_kernels()).lower()
    if choice not in KERNEL_CHOICES:
        raise InvalidArgumentError(
            f"FD_CUDA_KERNELS must be one of {', '.join(KERNEL_CHOICES)}, got {choice!r}"
        )
    reason = triton_unavailable_reason(on_gpu)
    if choice == "triton" and reason is not None:
        raise BackendUnavailableError(f"FD_CUDA_KERNELS=triton cannot be honoured: {reason}")
    if choice == "auto":
        if on_gpu and reason is not None:
            logger.warning("cuda backend falls back to reference kernels: %s", reason)
        return "triton" if on_gpu and reason is None else "reference"
    return choice


class TritonLauncher:
    """Calls a launcher function of the kernel modules with the runtime's tensors."""

    def __init__(self, runtime: TensorRuntime) -> None:
        # the kernel modules import triton, an optional dependency (the reference kernels need none)
        from fastdeploy.backends.cuda import (
            triton_attention,
            triton_kernels,
            triton_latent,
            triton_lora,
            triton_moe,
            triton_quant,
            triton_sampling,
        )

        self.runtime = runtime
        #: picks the prefill and MoE tile sizes (larger on Hopper)
        self.shared_memory = device_shared_memory() if runtime.on_gpu else None
        self.attention = triton_attention
        self.elementwise = triton_kernels
        self.latent = triton_latent
        self.moe = triton_moe
        self.lora = triton_lora
        self.quant = triton_quant
        self.sampling = triton_sampling

    def _convert(self, value: Any) -> Any:
        if isinstance(value, dict):  # scratch buffers
            return {key: self.runtime.kernel_args(item) for key, item in value.items()}
        return self.runtime.kernel_args(value)

    def __call__(self, function: Any, *args: Any, **kwargs: Any) -> None:
        function(
            *(self._convert(value) for value in args), **{k: self._convert(v) for k, v in kwargs.items()}
        )
