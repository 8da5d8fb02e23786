"""The torch tensor runtime of the cuda backend, and why torch cannot be used here.

The availability check reads torch's `version.py` (its `cuda` field is None in CPU builds) and
the GPU device files before anything imports torch, so a machine without a GPU or without a
CUDA build of torch is told so in milliseconds.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastdeploy.backends.cuda.gpu_probe import local_gpu_index, visible_gpu_reason
from fastdeploy.backends.cuda.runtimes.base import DeviceEvent, DeviceGraph, HostBuffer, TensorRuntime


def _torch_build() -> tuple[str, str | None] | None:
    """(version, CUDA version or None) of the installed torch, read without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        with open(version_file, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
    cuda = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    found = version.group(1) if version else importlib.metadata.version("torch")
    return found, cuda.group(1) if cuda else None


def torch_unavailable_reason() -> str | None:
    """Why torch tensors cannot be used at all (the torch-cpu device), or None."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install torch)"
    return None


def gpu_unavailable_reason() -> str | None:
    """Why torch cannot run the cuda backend here (no CUDA build, no visible GPU), or None."""
    build = _torch_build()
    if build is None:
        return "torch is not installed"
    version, cuda = build
    if cuda is None:
        return f"found torch {version} built without CUDA"
    gpu = visible_gpu_reason()
    if gpu is not None:
        return gpu
    import torch

    if not torch.cuda.is_available():
        return f"torch {version} (CUDA {cuda}) sees no GPU"
    return None


def gpu_capability() -> tuple[int, int]:
    """(major, minor) compute capability of this process's GPU (torch with CUDA must be usable)."""
    import torch

    major, minor = torch.cuda.get_device_capability(local_gpu_index())
    return int(major), int(minor)


def torch_description() -> str:
    build = _torch_build()
    if build is None:
        return "torch"
    return f"torch {build[0]}" + (f" (CUDA {build[1]})" if build[1] else "")


class TorchMemory:
    """torch's CUDA caching-allocator statistics for one device."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.cuda = torch.cuda
        self.device = device

    def total(self) -> int:
        return int(self.cuda.get_device_properties(self.device).total_memory)

    def allocated(self) -> int:
        return int(self.cuda.memory_allocated(self.device))

    def free(self) -> int:
        """Free memory on the device as the driver reports it (other processes included)."""
        free, _ = self.cuda.mem_get_info(self.device)
        return int(free)

    def reset_peak(self) -> None:
        self.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        return int(self.cuda.max_memory_allocated(self.device))

    def synchronize(self) -> None:
        self.cuda.synchronize(self.device)


class TorchGraph(DeviceGraph):
    """`torch.cuda.CUDAGraph`; captured graphs share one memory pool so buckets reuse memory."""

    def __init__(self, torch: Any, pool: Any) -> None:
        self.torch = torch
        self.pool = pool
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], Any]) -> Any:
        with self.torch.cuda.graph(self.graph, pool=self.pool):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()


class TorchEvent(DeviceEvent):
    """`torch.cuda.Event` recorded on the current stream."""

    def __init__(self, torch: Any) -> None:
        self.event = torch.cuda.Event()
        self.event.record()

    def wait(self) -> None:
        self.event.synchronize()


#: host arrays up to this size (a step's token ids, positions, slots, block tables) go to the GPU
#: through pinned memory without waiting for the GPU: a blocking copy would wait for the pass in
#: flight and undo async scheduling; larger ones (weights) are copied as they are, blocking
STAGED_COPY_BYTES = 1 << 20

_DTYPES = ("float32", "float16", "bfloat16", "int32", "int64", "uint8", "bool")


class TorchRuntime(TensorRuntime):
    """torch tensors on this process's GPU (`cuda:N`, N from `gpu_probe.local_gpu_index`; each rank
    process sees only its own GPU, so N is 0 unless a launcher selected another), or on the host
    (the `torch-cpu` device)."""

    name = "torch"

    def __init__(self, on_gpu: bool, threads: int | None = None) -> None:
        super().__init__(on_gpu)
        import torch
        import torch.nn.functional as functional

        self.torch = torch
        self._functional = functional
        self.device = torch.device(f"cuda:{local_gpu_index()}" if on_gpu else "cpu")
        self.threads = None
        if on_gpu:
            torch.cuda.set_device(self.device)
            self._graph_pool = torch.cuda.graph_pool_handle()
        elif threads:
            torch.set_num_threads(threads)
            self.threads = threads
        self._dtypes = {name: getattr(torch, name) for name in _DTYPES}

    def describe(self) -> str:
        if self.on_gpu:
            return f"{torch_description()}, {self.torch.cuda.get_device_name(self.device)}"
        threads = f", {self.threads} threads" if self.threads else ""
        return f"{torch_description()}, host{threads}"

    def compute_capability(self) -> tuple[int, int] | None:
        if not self.on_gpu:
            return None
        major, minor = self.torch.cuda.get_device_capability(self.device)
        return int(major), int(minor)

    def from_numpy(self, array: np.ndarray, dtype: str | None = None) -> Any:
        array = np.ascontiguousarray(array)
        with warnings.catch_warnings():  # a read-only (memory-mapped) array: it is only read below
            warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
            if array.dtype.name == "bfloat16":  # ml_dtypes bfloat16: same bits as torch.bfloat16
                host = self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16)
            else:
                host = self.torch.from_numpy(array)
        source, non_blocking = self._staged(host)
        tensor = source.to(self.device, non_blocking=non_blocking)
        if tensor is host:
            tensor = tensor.clone()  # never alias the caller's (perhaps memory-mapped) array
        if dtype is not None and tensor.is_floating_point() and str(tensor.dtype) != f"torch.{dtype}":
            tensor = tensor.to(self._dtypes[dtype])
        return tensor

    def to_numpy(self, tensor: Any) -> np.ndarray:
        if tensor.dtype in (self.torch.float16, self.torch.bfloat16):
            tensor = tensor.float()
        return tensor.detach().cpu().numpy()

    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        return self.torch.empty(tuple(shape), dtype=self._dtypes[dtype], device=self.device)

    def zeros(self, shape: Sequence[int], dtype: str) -> Any:
        return self.torch.zeros(tuple(shape), dtype=self._dtypes[dtype], device=self.device)

    def empty_like(self, tensor: Any) -> Any:
        return self.torch.empty_like(tensor)

    def copy_from_host(self, target: Any, array: np.ndarray) -> None:
        source, non_blocking = self._staged(self.torch.from_numpy(np.ascontiguousarray(array)))
        target.copy_(source, non_blocking=non_blocking)

    def host_buffer(self, shape: Sequence[int], dtype: str) -> HostBuffer:
        """Pinned on a GPU (its copies then need not wait for the device); the array is a view."""
        if not self.on_gpu:
            return super().host_buffer(shape, dtype)
        tensor = self.torch.zeros(tuple(shape), dtype=self._dtypes[dtype], pin_memory=True)
        return HostBuffer(tensor.numpy(), tensor)

    def copy_from_host_buffer(self, target: Any, source: HostBuffer, rows: int | None = None) -> None:
        if not self.on_gpu:
            return super().copy_from_host_buffer(target, source, rows)
        handle = source.handle if rows is None else source.handle[:rows]
        (target if rows is None else target[:rows]).copy_(handle, non_blocking=True)

    def record_event(self) -> DeviceEvent:
        return TorchEvent(self.torch) if self.on_gpu else super().record_event()

    def _staged(self, host: Any) -> tuple[Any, bool]:
        """(the host tensor to copy to the GPU from, whether the copy may skip waiting for the
        GPU): small ones through pinned memory (`STAGED_COPY_BYTES`), others as they are."""
        if self.on_gpu and host.nbytes <= STAGED_COPY_BYTES:
            return host.pin_memory(), True
        return host, False

    def copy_to_host_later(self, tensors: Sequence[Any]) -> Callable[[], list[np.ndarray]]:
        if not self.on_gpu:
            return super().copy_to_host_later(tensors)
        torch = self.torch
        hosts = [torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=True) for t in tensors]
        for host, tensor in zip(hosts, tensors, strict=True):
            host.copy_(tensor, non_blocking=True)
        done = torch.cuda.Event()
        done.record()

        def wait() -> list[np.ndarray]:
            done.synchronize()
            return [host.numpy() for host in hosts]

        return wait

    def token_rows(self, x: Any) -> tuple[Any, int]:
        expected = 1
        for dim in range(x.dim() - 1, 0, -1):
            if x.shape[dim] != 1 and x.stride(dim) != expected:
                return super().token_rows(x)
            expected *= x.shape[dim]
        return x, int(x.stride(0)) if x.shape[0] > 1 else expected

    def cast(self, tensor: Any, dtype: str) -> Any:
        return tensor.to(self._dtypes[dtype])

    def dtype_name(self, tensor: Any) -> str:
        return str(tensor.dtype).replace("torch.", "")

    def matmul(self, a: Any, b: Any) -> Any:
        return self.torch.matmul(a, b)

    def index_select(self, x: Any, index: Any) -> Any:
        return self.torch.index_select(x, 0, index)

    def index_copy_(self, x: Any, index: Any, source: Any) -> None:
        x.index_copy_(0, index, source)

    def permute(self, x: Any, dims: Sequence[int]) -> Any:
        return x.permute(*dims)

    def concat(self, tensors: Sequence[Any], axis: int) -> Any:
        return self.torch.cat(list(tensors), dim=axis)

    def softmax(self, x: Any, axis: int) -> Any:
        return self.torch.softmax(x, dim=axis)

    def rsqrt(self, x: Any) -> Any:
        return self.torch.rsqrt(x)

    def silu(self, x: Any) -> Any:
        return self._functional.silu(x)

    def gelu_tanh(self, x: Any) -> Any:
        return self._functional.gelu(x, approximate="tanh")

    def gelu(self, x: Any) -> Any:
        return self._functional.gelu(x)

    def sigmoid(self, x: Any) -> Any:
        return self.torch.sigmoid(x)

    def bidirectional_attention(self, q: Any, k: Any, v: Any, scale: float) -> Any:
        """torch's fused attention (flash or memory-efficient kernels on a GPU; float32 softmax)."""
        return self._functional.scaled_dot_product_attention(q, k, v, scale=scale)

    def layer_norm(self, x: Any, weight: Any, bias: Any | None, eps: float) -> Any:
        return self._functional.layer_norm(x, (x.shape[-1],), weight=weight, bias=bias, eps=eps)

    def sum_rows(self, x: Any, axis: int) -> Any:
        return x.sum(dim=axis)

    def max_rows(self, x: Any) -> Any:
        return x.amax(dim=-1)

    def argmax_rows(self, x: Any) -> Any:
        return self.torch.argmax(x, dim=-1)

    def memory(self) -> TorchMemory | None:
        return TorchMemory(self.torch, self.device) if self.on_gpu else None

    def synchronize(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def multiprocessor_count(self) -> int:
        return int(self.torch.cuda.get_device_properties(self.device).multi_processor_count)

    def new_graph(self) -> DeviceGraph:
        return TorchGraph(self.torch, self._graph_pool)
