"""The thin tensor layer under the cuda backend: what differs between paddle and torch.

The backend, its Triton kernels and its reference kernels are written once against this
interface; `PaddleRuntime` and `TorchRuntime` implement it. It covers tensor creation and host
transfers, dtype casts, the matmul, the handful of element-wise and indexing ops the reference
kernels need, device memory statistics and CUDA graphs. Tensor methods that both frameworks
spell alike (`reshape`, `contiguous`, slicing, `+`, `*`, `.shape`) are used directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.backends.cuda.memory import DeviceMemory

#: the floating dtypes the cuda backend stores weights, activations and the KV cache in
FLOAT_DTYPES = ("float32", "float16", "bfloat16")


class DeviceGraph(ABC):
    """One captured sequence of kernel launches, replayed on the tensors it captured."""

    @abstractmethod
    def capture(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` once under capture; returns its outputs (tensors the replays overwrite)."""

    @abstractmethod
    def replay(self) -> None:
        """Launch the captured kernels again."""


class DeviceEvent:
    """A point in the device's queue; `wait` blocks the host until the work queued before it is
    done. This one is always complete (a runtime whose copies wait for the device anyway)."""

    def wait(self) -> None:
        """Return once the device has passed this point."""


@dataclass
class HostBuffer:
    """Host memory the device can copy from without waiting (pinned on a GPU): `array` is written
    by the host, `handle` is what the runtime copies from (the same memory)."""

    array: np.ndarray
    handle: Any


class TensorRuntime(ABC):
    """A tensor framework on one place (a GPU, or the host for checking the code on a CPU)."""

    #: "paddle" or "torch"
    name: str

    def __init__(self, on_gpu: bool) -> None:
        self.on_gpu = on_gpu

    @abstractmethod
    def describe(self) -> str:
        """Framework, version and place, for logs and `fastdeploy env`."""

    @abstractmethod
    def compute_capability(self) -> tuple[int, int] | None:
        """(major, minor) of the GPU, None on the host."""

    # --- creation and transfers -----------------------------------------------------------
    @abstractmethod
    def from_numpy(self, array: np.ndarray, dtype: str | None = None) -> Any:
        """A device copy of `array`; floating arrays are cast to `dtype` on the device (the host
        array is sent in its own dtype, so a bfloat16 checkpoint moves 2 bytes per weight)."""

    @abstractmethod
    def to_numpy(self, tensor: Any) -> np.ndarray:
        """Host copy; float16/bfloat16 come back as float32."""

    def copy_to_host_later(self, tensors: Sequence[Any]) -> Callable[[], list[np.ndarray]]:
        """Start copying `tensors` to the host without waiting for the work queued before them;
        the returned function waits for the copies and returns the arrays. This default copies
        now (a runtime whose transfers wait for the device anyway), into arrays of their own: on
        the host `to_numpy` may share the tensor's memory, which a graph replay overwrites."""
        arrays = [np.array(self.to_numpy(tensor), copy=True) for tensor in tensors]
        return lambda: arrays

    @abstractmethod
    def empty(self, shape: Sequence[int], dtype: str) -> Any: ...

    @abstractmethod
    def zeros(self, shape: Sequence[int], dtype: str) -> Any: ...

    @abstractmethod
    def empty_like(self, tensor: Any) -> Any: ...

    @abstractmethod
    def copy_from_host(self, target: Any, array: np.ndarray) -> None:
        """Overwrite `target` (same shape and dtype) with a host array, in place."""

    def host_buffer(self, shape: Sequence[int], dtype: str) -> HostBuffer:
        """Host memory for inputs copied every step (`copy_from_host_buffer`). This default is a
        plain array (the copy then waits for the device)."""
        array = np.zeros(tuple(shape), dtype)
        return HostBuffer(array, array)

    def copy_from_host_buffer(self, target: Any, source: HostBuffer, rows: int | None = None) -> None:
        """Overwrite `target` (at least its first `rows` rows) with `source`'s, queued behind the
        work already queued and without waiting for it where the runtime can; the host must not
        write `source` again before an event recorded after this copy has passed. This default
        copies the whole buffer with `copy_from_host` (a slice of a tensor need not be a view in
        every framework)."""
        self.copy_from_host(target, source.array)

    def record_event(self) -> DeviceEvent:
        """An event behind the work queued so far."""
        return DeviceEvent()

    def token_rows(self, x: Any) -> tuple[Any, int]:
        """x [tokens, ...] with dense inner dimensions, and the elements between its tokens: a
        kernel then reads a slice of a wider row (q, k or v of the fused qkv projection) in
        place. This default copies into a contiguous tensor."""
        x = x.contiguous()
        return x, int(np.prod(x.shape[1:], dtype=np.int64))

    @abstractmethod
    def cast(self, tensor: Any, dtype: str) -> Any: ...

    @abstractmethod
    def dtype_name(self, tensor: Any) -> str:
        """ "float32", "bfloat16", "int64", ..."""

    # --- math -------------------------------------------------------------------------------
    @abstractmethod
    def matmul(self, a: Any, b: Any) -> Any:
        """a [m, k] @ b [k, n] (batched over leading dimensions)."""

    @abstractmethod
    def index_select(self, x: Any, index: Any) -> Any:
        """x[index] along axis 0."""

    @abstractmethod
    def index_copy_(self, x: Any, index: Any, source: Any) -> None:
        """x[index] = source along axis 0, in place."""

    @abstractmethod
    def permute(self, x: Any, dims: Sequence[int]) -> Any: ...

    @abstractmethod
    def concat(self, tensors: Sequence[Any], axis: int) -> Any: ...

    @abstractmethod
    def softmax(self, x: Any, axis: int) -> Any: ...

    @abstractmethod
    def rsqrt(self, x: Any) -> Any: ...

    @abstractmethod
    def silu(self, x: Any) -> Any: ...

    @abstractmethod
    def gelu_tanh(self, x: Any) -> Any: ...

    @abstractmethod
    def gelu(self, x: Any) -> Any:
        """Exact GELU, with the error function."""

    @abstractmethod
    def sigmoid(self, x: Any) -> Any: ...

    def bidirectional_attention(self, q: Any, k: Any, v: Any, scale: float) -> Any:
        """Attention without a mask, q/k/v [batch, heads, n, head_dim] -> the same shape (a vision
        tower's segments). This default forms the [n, n] scores, softmax in float32; a runtime with
        a fused kernel overrides it."""
        dtype = self.dtype_name(q)
        scores = self.matmul(self.cast(q, "float32"), self.permute(self.cast(k, "float32"), [0, 1, 3, 2]))
        probabilities = self.softmax(scores * scale, -1)
        return self.cast(self.matmul(probabilities, self.cast(v, "float32")), dtype)

    @abstractmethod
    def layer_norm(self, x: Any, weight: Any, bias: Any | None, eps: float) -> Any: ...

    @abstractmethod
    def sum_rows(self, x: Any, axis: int) -> Any:
        """Sum over `axis` (dropping it)."""

    @abstractmethod
    def max_rows(self, x: Any) -> Any:
        """Largest value of each row of x [rows, n]; NaN where the row holds a NaN."""

    @abstractmethod
    def argmax_rows(self, x: Any) -> Any:
        """Index of the largest value of each row of x [rows, n] (the first among equals)."""

    # --- device -----------------------------------------------------------------------------
    @abstractmethod
    def memory(self) -> DeviceMemory | None:
        """Allocator statistics of the GPU; None on the host."""

    @abstractmethod
    def synchronize(self) -> None: ...

    @abstractmethod
    def multiprocessor_count(self) -> int:
        """Streaming multiprocessors of the GPU (sizes the split-KV decode grid)."""

    @abstractmethod
    def new_graph(self) -> DeviceGraph:
        """An empty CUDA graph (only on a GPU)."""

    def kernel_args(self, value: Any) -> Any:
        """What a Triton launch receives for `value` (torch tensors as they are)."""
        return value
