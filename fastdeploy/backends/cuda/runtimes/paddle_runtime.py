"""The paddle tensor runtime of the cuda backend, and why paddle cannot be used here.

The availability checks must be cheap (they run for `fastdeploy env` and `device="auto"`): they
read installed distributions' metadata and the GPU device files first, and import paddle only
when a GPU build is installed and a GPU is visible.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from fastdeploy.backends.cuda.gpu_probe import local_gpu_index, visible_gpu_reason
from fastdeploy.backends.cuda.runtimes.base import DeviceGraph, TensorRuntime
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
    """Why paddle cannot run the cuda backend here (no GPU build, no visible GPU), or None."""
    found = installed_paddle()
    if found is None:
        return "paddlepaddle-gpu is not installed"
    distribution, version = found
    if distribution == CPU_DISTRIBUTION:
        return f"found paddlepaddle {version}, the CPU build (the GPU build is paddlepaddle-gpu)"
    gpu = visible_gpu_reason()
    if gpu is not None:
        return gpu
    try:
        paddle = import_paddle()
    except Exception as exc:  # a broken install must be reported, not crash `fastdeploy env`
        return f"importing {distribution} {version} failed: {exc}"
    if not paddle.is_compiled_with_cuda():
        return f"found {distribution} {version} built without CUDA"
    if paddle.device.cuda.device_count() < 1:
        return f"{distribution} {version} sees no GPU"
    return None


def gpu_capability() -> tuple[int, int]:
    """(major, minor) compute capability of this process's GPU (paddlepaddle-gpu must be usable)."""
    major, minor = import_paddle().device.cuda.get_device_capability(local_gpu_index())
    return int(major), int(minor)


def set_cpu_threads(paddle: ModuleType, count: int) -> int:
    """Paddle's CPU math starts on one thread; give it `count`."""
    paddle.base.core.set_num_threads(count)
    return count


class PaddleMemory:
    """Paddle's CUDA allocator statistics for one device."""

    def __init__(self, paddle: Any, device: int) -> None:
        self.cuda = paddle.device.cuda
        self.device = device

    def total(self) -> int:
        return int(self.cuda.get_device_properties(self.device).total_memory)

    def allocated(self) -> int:
        return int(self.cuda.memory_allocated(self.device))

    def free(self) -> int:
        """Total minus what paddle's allocator holds (other processes' use is not visible here)."""
        return self.total() - int(self.cuda.memory_reserved(self.device))

    def reset_peak(self) -> None:
        self.cuda.reset_max_memory_allocated(self.device)

    def peak(self) -> int:
        return int(self.cuda.max_memory_allocated(self.device))

    def synchronize(self) -> None:
        self.cuda.synchronize(self.device)


class PaddleGraph(DeviceGraph):
    """`paddle.device.cuda.graphs.CUDAGraph` (never run here: no paddlepaddle-gpu at hand)."""

    def __init__(self, paddle: Any) -> None:
        from paddle.device.cuda.graphs import CUDAGraph

        self.graph = CUDAGraph()

    def capture(self, fn: Callable[[], Any]) -> Any:
        self.graph.capture_begin()
        try:
            out = fn()
        finally:
            self.graph.capture_end()
        return out

    def replay(self) -> None:
        self.graph.replay()


class PaddleRuntime(TensorRuntime):
    """paddle tensors on this process's GPU (`gpu:N`, see `gpu_probe.local_gpu_index`), or on
    Paddle's CPU place (the `paddle-cpu` device)."""

    name = "paddle"

    def __init__(self, on_gpu: bool, threads: int | None = None) -> None:
        super().__init__(on_gpu)
        self.paddle = paddle = import_paddle()
        self._functional = paddle.nn.functional
        self.threads = None
        self.index = local_gpu_index()
        if on_gpu:
            paddle.device.set_device(f"gpu:{self.index}")
            self.place = paddle.CUDAPlace(self.index)
            # Triton launches on paddle tensors through paddle's torch-compat proxy, enabled for
            # the triton package before it is imported, as FastDeploy does
            paddle.enable_compat(scope={"triton"})
        else:
            self.place = paddle.CPUPlace()
            self.threads = set_cpu_threads(paddle, threads or 1)

    def describe(self) -> str:
        found = installed_paddle()
        version = f"{found[0]} {found[1]}" if found else "paddle"
        threads = f", {self.threads} threads" if self.threads else ""
        return f"{version}, place {self.place}{threads}"

    def compute_capability(self) -> tuple[int, int] | None:
        if not self.on_gpu:
            return None
        major, minor = self.paddle.device.cuda.get_device_capability(self.index)
        return int(major), int(minor)

    def from_numpy(self, array: np.ndarray, dtype: str | None = None) -> Any:
        if array.dtype.name == "bfloat16":  # paddle takes no ml_dtypes arrays
            array = array.astype(np.float32)
        tensor = self.paddle.to_tensor(np.ascontiguousarray(array), place=self.place)
        if dtype is not None and np.issubdtype(array.dtype, np.floating) and array.dtype.name != dtype:
            tensor = tensor.astype(dtype)
        return tensor

    def to_numpy(self, tensor: Any) -> np.ndarray:
        if tensor.dtype in (self.paddle.float16, self.paddle.bfloat16):
            tensor = tensor.astype("float32")
        return tensor.numpy()

    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        return self.paddle.empty(list(shape), dtype=dtype)

    def zeros(self, shape: Sequence[int], dtype: str) -> Any:
        return self.paddle.zeros(list(shape), dtype=dtype)

    def empty_like(self, tensor: Any) -> Any:
        return self.paddle.empty_like(tensor)

    def copy_from_host(self, target: Any, array: np.ndarray) -> None:
        self.paddle.assign(np.ascontiguousarray(array), output=target)

    def cast(self, tensor: Any, dtype: str) -> Any:
        return tensor.astype(dtype)

    def dtype_name(self, tensor: Any) -> str:
        return str(tensor.dtype).replace("paddle.", "")

    def matmul(self, a: Any, b: Any) -> Any:
        return self.paddle.matmul(a, b)

    def index_select(self, x: Any, index: Any) -> Any:
        return self.paddle.index_select(x, index)

    def index_copy_(self, x: Any, index: Any, source: Any) -> None:
        x.scatter_(index, source, overwrite=True)

    def permute(self, x: Any, dims: Sequence[int]) -> Any:
        return x.transpose(list(dims))

    def concat(self, tensors: Sequence[Any], axis: int) -> Any:
        return self.paddle.concat(list(tensors), axis=axis)

    def softmax(self, x: Any, axis: int) -> Any:
        return self._functional.softmax(x, axis=axis)

    def rsqrt(self, x: Any) -> Any:
        return self.paddle.rsqrt(x)

    def silu(self, x: Any) -> Any:
        return self._functional.silu(x)

    def gelu_tanh(self, x: Any) -> Any:
        return self._functional.gelu(x, approximate=True)

    def gelu(self, x: Any) -> Any:
        return self._functional.gelu(x)

    def sigmoid(self, x: Any) -> Any:
        return self._functional.sigmoid(x)

    def layer_norm(self, x: Any, weight: Any, bias: Any | None, eps: float) -> Any:
        return self._functional.layer_norm(x, [x.shape[-1]], weight=weight, bias=bias, epsilon=eps)

    def sum_rows(self, x: Any, axis: int) -> Any:
        return x.sum(axis=axis)

    def max_rows(self, x: Any) -> Any:
        return self.paddle.max(x, axis=-1)

    def argmax_rows(self, x: Any) -> Any:
        return self.paddle.argmax(x, axis=-1)

    def memory(self) -> PaddleMemory | None:
        return PaddleMemory(self.paddle, self.index) if self.on_gpu else None

    def synchronize(self) -> None:
        if self.on_gpu:
            self.paddle.device.cuda.synchronize(self.index)

    def multiprocessor_count(self) -> int:
        return int(self.paddle.device.cuda.get_device_properties(self.index).multi_processor_count)

    def new_graph(self) -> DeviceGraph:
        return PaddleGraph(self.paddle)

    def kernel_args(self, value: Any) -> Any:
        """On the CPU place Triton runs only in its interpreter, which needs torch tensors: paddle
        CPU tensors go over through DLPack without a copy, so kernels write into paddle's memory."""
        if not self.on_gpu and isinstance(value, self.paddle.Tensor):
            import torch

            return torch.from_dlpack(value)
        return value
