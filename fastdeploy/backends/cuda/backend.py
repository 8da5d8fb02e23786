"""The Paddle backends: "cuda" (paddlepaddle-gpu, GPU memory, Triton kernels) and "paddle-cpu".

Both are one class over a Paddle place. "paddle-cpu" exists so that every paddle code path the
cuda backend runs (weights, KV cache, batch metadata, attention, sampling) is exercised and
checked against the cpu backend on machines without a GPU; it is never picked by
`device="auto"` (the numpy cpu backend is faster on a CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fastdeploy.backends.base import Backend, BackendOptions, BatchLayout, KVCacheSpec
from fastdeploy.backends.cpu.attention import build_metadata
from fastdeploy.backends.cpu.backend import _available_host_memory
from fastdeploy.backends.cuda import reference
from fastdeploy.backends.cuda.kernels import TritonLauncher, choose_kernels
from fastdeploy.backends.cuda.memory import GpuMemory, kv_cache_budget
from fastdeploy.backends.cuda.runtime import (
    gpu_unavailable_reason,
    import_paddle,
    installed_paddle,
    paddle_unavailable_reason,
    set_cpu_threads,
)
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class PaddleBatch:
    """Attention metadata of one forward pass, on the device."""

    slot_mapping: Any
    reference: reference.ReferenceAttentionMetadata | None = None
    query_seq: Any = None  # Triton: [tokens] sequence index of each query token
    query_context: Any = None  # Triton: [tokens] positions each token attends to (position + 1)
    block_tables: Any = None  # Triton: [seqs, max_blocks]
    block_size: int = 0


class PaddleBackend(Backend):
    """Models on paddle tensors; subclasses fix the place."""

    on_gpu: ClassVar[bool] = False
    samples_on_device = True

    def __init__(self, options: BackendOptions, kernels: str | None = None) -> None:
        super().__init__(options)
        if options.dtype not in _FLOAT_DTYPES:
            raise InvalidArgumentError(
                f"dtype must be one of {', '.join(_FLOAT_DTYPES)} on the {self.name} backend, got {options.dtype!r}"
            )
        if not self.on_gpu and options.dtype != "float32":
            raise InvalidArgumentError(
                f"Paddle's CPU build has no {options.dtype} kernels; use dtype='float32' on {self.name}"
            )
        if options.threads is not None and options.threads < 1:
            raise InvalidArgumentError(f"threads must be >= 1, got {options.threads}")
        self.paddle = paddle = import_paddle()
        if self.on_gpu:
            paddle.device.set_device("gpu:0")
            self.place = paddle.CUDAPlace(0)
            self.memory: GpuMemory | None = GpuMemory(paddle)
            self.threads = None
        else:
            self.place = paddle.CPUPlace()
            self.memory = None
            self.threads = set_cpu_threads(paddle, options.thread_count())
        self.dtype = options.dtype
        self.kernels = choose_kernels(self.on_gpu, kernels)
        self.launch = TritonLauncher(paddle, self.on_gpu) if self.kernels == "triton" else None
        self._functional = paddle.nn.functional

    def describe(self) -> str:
        found = installed_paddle()
        version = f"{found[0]} {found[1]}" if found else "paddle"
        threads = f", {self.threads} threads" if self.threads else ""
        return f"{self.name} ({version}, place {self.place}{threads}, {self.dtype}, {self.kernels} kernels)"

    # --- memory ---------------------------------------------------------------------------
    def free_memory_bytes(self) -> int:
        if self.memory is not None:
            return self.memory.free()
        return _available_host_memory()

    def kv_cache_budget_bytes(self, utilization: float, profile_forward: Callable[[], Any]) -> int | None:
        if self.memory is None:
            return None
        return kv_cache_budget(self.memory, utilization, profile_forward)

    def allocate_kv_cache(self, spec: KVCacheSpec) -> list[tuple[Any, Any]]:
        shape = [spec.num_blocks * spec.block_size, spec.num_kv_heads, spec.head_dim]
        zeros = self.paddle.zeros
        return [
            (zeros(shape, dtype=self.dtype), zeros(shape, dtype=self.dtype)) for _ in range(spec.num_layers)
        ]

    # --- data movement --------------------------------------------------------------------
    def _tensor(self, array: np.ndarray) -> Any:
        return self.paddle.to_tensor(np.ascontiguousarray(array), place=self.place)

    def from_numpy(self, array: np.ndarray) -> Any:
        if np.issubdtype(array.dtype, np.floating) or array.dtype.name == "bfloat16":
            tensor = self._tensor(np.asarray(array, dtype=np.float32))
            return tensor if self.dtype == "float32" else tensor.astype(self.dtype)
        return self._tensor(array)

    def to_numpy(self, array: Any) -> np.ndarray:
        if array.dtype in (self.paddle.float16, self.paddle.bfloat16):
            array = array.astype("float32")
        return array.numpy()

    def linear_weight(self, *parts: np.ndarray) -> Any:
        stacked = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        # [in, out] contiguous so `linear` is a plain matmul
        return self.from_numpy(np.asarray(stacked, dtype=np.float32).T)

    def linear_bias(self, *parts: np.ndarray) -> Any:
        return self.from_numpy(np.concatenate([np.asarray(p, dtype=np.float32) for p in parts]))

    def prepare_batch(self, layout: BatchLayout) -> PaddleBatch:
        slot_mapping = self._tensor(layout.slot_mapping.astype(np.int64))
        if self.launch is None:
            host = build_metadata(layout)
            meta = reference.build_reference_metadata(self.paddle, self.place, self.dtype, host)
            return PaddleBatch(slot_mapping, reference=meta)
        query_seq = np.repeat(np.arange(layout.query_lens.size, dtype=np.int64), layout.query_lens)
        return PaddleBatch(
            slot_mapping,
            query_seq=self._tensor(query_seq),
            query_context=self._tensor((layout.positions + 1).astype(np.int64)),
            block_tables=self._tensor(layout.block_tables.astype(np.int64)),
            block_size=layout.block_size,
        )

    # --- ops --------------------------------------------------------------------------------
    def embedding(self, token_ids: Any, table: Any) -> Any:
        return self.paddle.index_select(table, token_ids)

    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        out = self.paddle.matmul(x, weight)
        return out + bias if bias is not None else out

    def rms_norm(self, x: Any, weight: Any, eps: float, residual: Any | None = None) -> tuple[Any, Any]:
        if self.launch is None:
            return reference.rms_norm(self.paddle, x, weight, eps, residual)
        x = x.contiguous()
        residual = residual.contiguous() if residual is not None else None
        out = self.paddle.empty_like(x)
        new_residual = self.paddle.empty_like(x) if residual is not None else x
        self.launch("rms_norm", x, weight, eps=eps, residual=residual, out=out, residual_out=new_residual)
        return out, new_residual

    def rotary_embedding(self, x: Any, positions: Any, cos: Any, sin: Any) -> Any:
        if self.launch is None:
            return reference.rotary_embedding(self.paddle, x, positions, cos, sin)
        x = x.contiguous()
        out = self.paddle.empty_like(x)
        self.launch("rotary_embedding", x, positions, cos, sin, out)
        return out

    def silu_and_mul(self, x: Any) -> Any:
        half = x.shape[-1] // 2
        return self._functional.silu(x[:, :half]) * x[:, half:]

    def layer_norm(
        self, x: Any, weight: Any, bias: Any | None, eps: float, residual: Any | None = None
    ) -> tuple[Any, Any]:
        if residual is not None:
            x = x + residual
        return self._functional.layer_norm(x, [x.shape[-1]], weight=weight, bias=bias, epsilon=eps), x

    def gelu_tanh(self, x: Any) -> Any:
        return self._functional.gelu(x, approximate=True)

    def attention(
        self, q: Any, k: Any, v: Any, kv_cache: tuple[Any, Any], batch: PaddleBatch, scale: float
    ) -> Any:
        key_cache, value_cache = kv_cache
        if self.launch is None:
            reference.store_kv(k, v, key_cache, value_cache, batch.slot_mapping)
            return reference.paged_attention(self.paddle, q, kv_cache, batch.reference, scale)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        self.launch("store_kv", k, v, key_cache, value_cache, batch.slot_mapping)
        out = self.paddle.empty_like(q)
        self.launch(
            "paged_attention",
            q,
            key_cache,
            value_cache,
            batch.block_tables,
            batch.query_seq,
            batch.query_context,
            out,
            scale=scale,
            block_size=batch.block_size,
        )
        return out

    def gather_rows(self, x: Any, indices: Any) -> Any:
        return self.paddle.index_select(x, indices)

    def sample_top_k_top_p(
        self,
        logits: Any,
        temperatures: np.ndarray,
        top_k: np.ndarray,
        top_p: np.ndarray,
        uniforms: np.ndarray,
    ) -> np.ndarray:
        temperatures_t = self._tensor(np.asarray(temperatures, dtype=np.float32))
        top_k_t = self._tensor(np.asarray(top_k, dtype=np.int32))
        top_p_t = self._tensor(np.asarray(top_p, dtype=np.float32))
        uniforms_t = self._tensor(np.asarray(uniforms, dtype=np.float32))
        logits = logits.astype("float32").contiguous()
        if self.launch is None:
            chosen = reference.sample_top_k_top_p(
                self.paddle, logits, temperatures_t, top_k_t, top_p_t, uniforms_t
            )
        else:
            chosen = self.paddle.empty([logits.shape[0]], dtype="int64")
            self.launch("sample_top_k_top_p", logits, temperatures_t, top_k_t, top_p_t, uniforms_t, chosen)
        return chosen.numpy()


class CudaBackend(PaddleBackend):
    """paddlepaddle-gpu on the first visible GPU, with the Triton kernels."""

    name = "cuda"
    auto_priority = 100
    on_gpu = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return gpu_unavailable_reason()


class PaddleCpuBackend(PaddleBackend):
    """The cuda backend's code on Paddle's CPU place, for checking it without a GPU."""

    name = "paddle-cpu"
    auto_priority = -10
    on_gpu = False

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return paddle_unavailable_reason()
