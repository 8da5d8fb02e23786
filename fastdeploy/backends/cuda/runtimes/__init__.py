"""Which tensor framework runs the cuda backend: paddle (preferred) or torch.

paddlepaddle-gpu is the design's choice, as in FastDeploy, and wins when it is installed with
CUDA; otherwise torch with CUDA, what most GPU machines already carry. `FD_CUDA_RUNTIME=paddle|torch`
forces one. Every check here is cheap until a framework is actually usable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastdeploy import envs
from fastdeploy.backends.cuda.gpu_probe import visible_gpu_reason
from fastdeploy.backends.cuda.runtimes import paddle_runtime, torch_runtime
from fastdeploy.backends.cuda.runtimes.base import FLOAT_DTYPES, DeviceGraph, TensorRuntime
from fastdeploy.errors import InvalidArgumentError

__all__ = ["FLOAT_DTYPES", "DeviceGraph", "GpuRuntimeChoice", "TensorRuntime", "choose_gpu_runtime"]

RUNTIME_NAMES = ("paddle", "torch")

_GPU_REASONS: dict[str, Callable[[], str | None]] = {
    "paddle": paddle_runtime.gpu_unavailable_reason,
    "torch": torch_runtime.gpu_unavailable_reason,
}


@dataclass(frozen=True)
class GpuRuntimeChoice:
    """The runtime that will run the cuda backend (None: none can) and why."""

    name: str | None
    why: str


def _forced_runtime() -> str | None:
    forced = envs.cuda_runtime()
    if forced is not None and forced not in RUNTIME_NAMES:
        raise InvalidArgumentError(
            f"FD_CUDA_RUNTIME must be one of {', '.join(RUNTIME_NAMES)}, got {forced!r}"
        )
    return forced


def choose_gpu_runtime() -> GpuRuntimeChoice:
    """paddle if it can run here, else torch; FD_CUDA_RUNTIME forces one."""
    forced = _forced_runtime()
    if forced is not None:
        reason = _GPU_REASONS[forced]()
        if reason is not None:
            return GpuRuntimeChoice(None, f"FD_CUDA_RUNTIME={forced}, but {reason}")
        return GpuRuntimeChoice(forced, f"FD_CUDA_RUNTIME={forced}")
    paddle_reason = paddle_runtime.gpu_unavailable_reason()
    if paddle_reason is None:
        return GpuRuntimeChoice("paddle", "paddlepaddle-gpu with CUDA is installed (preferred)")
    torch_reason = torch_runtime.gpu_unavailable_reason()
    if torch_reason is None:
        return GpuRuntimeChoice("torch", f"torch with CUDA, since paddle cannot run: {paddle_reason}")
    gpu = visible_gpu_reason()
    return GpuRuntimeChoice(
        None,
        "cuda backend needs a visible NVIDIA GPU and paddlepaddle-gpu or torch built with CUDA; "
        f"paddle: {paddle_reason}; torch: {torch_reason}"
        + (f"; GPU: {gpu}" if gpu and gpu not in torch_reason else ""),
    )


def build_runtime(name: str, on_gpu: bool, threads: int | None) -> TensorRuntime:
    runtime_class = paddle_runtime.PaddleRuntime if name == "paddle" else torch_runtime.TorchRuntime
    return runtime_class(on_gpu, threads)
