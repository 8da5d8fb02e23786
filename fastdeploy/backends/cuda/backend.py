"""The cuda backend: Triton kernels over a thin tensor runtime (paddle or torch).

One class, `TensorBackend`, holds everything the backend does (weights, KV cache, per-step
metadata, kernel launches, MoE, device sampling, CUDA graphs); a `TensorRuntime` supplies the
framework-specific few (tensor creation, matmul, casts, memory statistics, graphs). Devices:

- `cuda`: an NVIDIA GPU, runtime paddle (preferred) or torch (`runtimes.choose_gpu_runtime`);
- `paddle-cpu`, `torch-cpu`: the same class on the host with that runtime, so every code path of
  both runtimes is exercised in CI without a GPU (reference kernels, or the Triton kernels under
  `TRITON_INTERPRET=1`). `device="auto"` never picks them: the numpy cpu backend is faster there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.backends.capabilities import Capability
from fastdeploy.backends.conformance import numpy_reference
from fastdeploy.backends.cpu.attention import build_metadata
from fastdeploy.backends.cpu.host_memory import available_host_memory, physical_host_memory
from fastdeploy.backends.cuda import reference
from fastdeploy.backends.cuda.attention_metadata import CudaBatch, build_host_metadata
from fastdeploy.backends.cuda.cuda_graphs import DecodeGraphs
from fastdeploy.backends.cuda.gpu_probe import visible_gpus
from fastdeploy.backends.cuda.latent_attention import reference_latent_attention, triton_latent_attention
from fastdeploy.backends.cuda.launch import TritonLauncher, choose_kernels
from fastdeploy.backends.cuda.memory import kv_cache_budget
from fastdeploy.backends.cuda.quantized_linear import QuantizedWeight, packed_parts
from fastdeploy.backends.cuda.runtimes import (
    FLOAT_DTYPES,
    TensorRuntime,
    build_runtime,
    choose_gpu_runtime,
    paddle_runtime,
    torch_runtime,
)
from fastdeploy.backends.cuda.token_bitmask import TokenBitmask
from fastdeploy.backends.lora import LoRASegments, LoRAStack, segments_by_slot
from fastdeploy.backends.types import BackendOptions, BatchLayout, KVCacheSpec, PendingTokens
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.weight_only import WeightOnlyTensor, concat_rows
from fastdeploy.kv_layout import WIRE_DTYPES
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: the first compute capability with bfloat16 tensor cores (Ampere)
BF16_MIN_CAPABILITY = (8, 0)
#: the first compute capability with FP8 (e4m3) tensor cores (Ada; Hopper is 9.0)
FP8_MIN_CAPABILITY = (8, 9)
#: `quantization=` values the Triton kernels run (fp8 only where `FP8_MIN_CAPABILITY` allows)
QUANTIZATIONS = ("wint8", "wint4", "fp8")


@dataclass
class StackedExperts:
    """A layer's routed experts for the fused MoE kernels: [experts, in, out] each, in the compute
    dtype, or quantised (`scales` set): wint8 int8 [experts, in, out] with scales [experts, out],
    wint4 (`group_size` set) uint8 [experts, in / 2, out] with scales [experts, in / group, out],
    or `fp8` e4m3 bits uint8 [experts, in, out] with scales [experts, in / 128, out / 128]."""

    gate_up: Any  # [experts, hidden, 2 * width]
    down: Any  # [experts, width, hidden]
    gate_up_scales: Any = None
    down_scales: Any = None
    group_size: int = 0
    fp8: bool = False


@dataclass
class CudaLoRARows:
    """A pass's adapter rows on the device: sorted by slot (`segments`), their pass rows, each
    segment's start (and the end) and slot, and the longest segment's length."""

    grouped: LoRASegments
    indices: Any
    starts: Any
    slots: Any
    longest: int


def _out_of_memory(exc: BaseException) -> bool:
    return "out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError"


class TensorBackend(Backend):
    """The cuda backend's code on a runtime; subclasses fix the place and the runtime."""

    on_gpu: ClassVar[bool] = False
    #: "paddle" or "torch"; None: chosen at construction (cuda)
    runtime_name: ClassVar[str | None] = None
    weight_packing = "weight_only"
    capabilities = frozenset(
        {
            Capability.DEVICE_SAMPLING,
            Capability.OVERLAPS_HOST,
            Capability.TOKEN_BITMASK,
            Capability.KV_BLOCK_COPY,
            Capability.KV_BLOCK_TRANSFER,
            Capability.FUSED_MOE,
            Capability.DEVICE_ROW_REDUCTIONS,
            Capability.VISION_OPS,
            Capability.LORA,
            Capability.QUANTIZED_WEIGHTS,
            Capability.SLIDING_WINDOW,
            Capability.ATTENTION_SINKS,
            Capability.ATTENTION_SOFTCAP,
            Capability.LATENT_ATTENTION,
        }
    )

    def __init__(self, options: BackendOptions, kernels: str | None = None) -> None:
        super().__init__(options)
        if options.dtype not in FLOAT_DTYPES:
            raise InvalidArgumentError(
                f"dtype must be one of {', '.join(FLOAT_DTYPES)} (or 'auto') on the {self.name} backend, "
                f"got {options.dtype!r}"
            )
        if options.threads is not None and options.threads < 1:
            raise InvalidArgumentError(f"threads must be >= 1, got {options.threads}")
        name, self.runtime_reason = self._runtime_choice()
        threads = None if self.on_gpu else options.thread_count()
        self.rt: TensorRuntime = build_runtime(name, self.on_gpu, threads)
        self.dtype = options.dtype
        self._check_dtype()
        self.kernels = choose_kernels(self.on_gpu, kernels)
        self.launch = TritonLauncher(self.rt) if self.kernels == "triton" else None
        self.memory = self.rt.memory()
        self.num_kv_heads = 0
        self.num_sms = self.rt.multiprocessor_count() if self.on_gpu else 4
        self.token_bitmask = TokenBitmask(self.rt)
        #: bytes of the linear weights sent to the device so far, by format ("bfloat16", "wint4", ...)
        self.weight_bytes: dict[str, int] = {}

    def _runtime_choice(self) -> tuple[str, str]:
        if self.runtime_name is not None:
            return self.runtime_name, f"the {self.name} device"
        choice = choose_gpu_runtime()
        assert choice.name is not None, choice.why  # unavailable_reason() said it can run
        return choice.name, choice.why

    def _check_dtype(self) -> None:
        if self.on_gpu:
            capability = self.rt.compute_capability()
            if self.dtype == "bfloat16" and capability is not None and capability < BF16_MIN_CAPABILITY:
                raise InvalidArgumentError(
                    f"dtype='bfloat16' needs an NVIDIA GPU of compute capability 8.0 (Ampere) or newer; "
                    f"this GPU is sm_{capability[0]}{capability[1]}: pass dtype='float16' or 'float32'"
                )
        elif self.rt.name == "paddle" and self.dtype != "float32":
            raise InvalidArgumentError(
                f"Paddle's CPU build has no {self.dtype} kernels; use dtype='float32' on {self.name}"
            )

    def describe(self) -> str:
        return (
            f"{self.name} ({self.rt.describe()}, {self.dtype}, {self.kernels} kernels; {self.runtime_reason})"
        )

    # --- memory ---------------------------------------------------------------------------
    def free_memory_bytes(self) -> int:
        return self.memory.free() if self.memory is not None else available_host_memory()

    def total_memory_bytes(self) -> int:
        return self.memory.total() if self.memory is not None else physical_host_memory()

    def kv_cache_budget_bytes(self, utilization: float, profile_forward: Callable[[], Any]) -> int | None:
        memory = self.memory
        if memory is None:
            return None
        try:
            return kv_cache_budget(memory, utilization, profile_forward)
        except Exception as exc:
            if not _out_of_memory(exc):
                raise
            raise InvalidArgumentError(
                f"the profiling forward pass ran out of GPU memory ({memory.total() / 2**30:.1f} GiB total, "
                f"weights {memory.allocated() / 2**30:.2f} GiB): lower max_num_batched_tokens "
                "(the largest step it profiles) or use a smaller dtype"
            ) from exc

    def allocate_kv_cache(self, spec: KVCacheSpec) -> list[tuple[Any, ...]]:
        """Per layer a (keys, values) pair [slots, kv_heads, head_dim], or for a "latent" cache
        a 1-tuple [slots, head_dim] (`latent_attention`); the block copies and transfers walk
        either."""
        self.num_kv_heads = spec.num_kv_heads
        slots = spec.num_blocks * spec.block_size
        shape = [slots, spec.num_kv_heads, spec.head_dim]
        try:
            if spec.kind == "latent":
                return [(self.rt.zeros([slots, spec.head_dim], self.dtype),) for _ in range(spec.num_layers)]
            return [
                (self.rt.zeros(shape, self.dtype), self.rt.zeros(shape, self.dtype))
                for _ in range(spec.num_layers)
            ]
        except Exception as exc:
            if not _out_of_memory(exc):
                raise
            total = spec.num_blocks * spec.bytes_per_block()
            raise InvalidArgumentError(
                f"allocating the KV cache ({spec.num_blocks} blocks, {total / 2**30:.2f} GiB) ran out of "
                "memory; lower gpu_memory_utilization, kv_cache_memory or num_gpu_blocks_override"
            ) from exc

    def copy_kv_blocks(self, kv_caches: list[tuple[Any, Any]], pairs: np.ndarray, block_size: int) -> None:
        offsets = np.arange(block_size, dtype=np.int64)
        source = self.rt.from_numpy((pairs[:, :1] * block_size + offsets).reshape(-1))
        destination = self.rt.from_numpy((pairs[:, 1:] * block_size + offsets).reshape(-1))
        for layer in kv_caches:
            for cache in layer:
                self.rt.index_copy_(cache, destination, self.rt.index_select(cache, source))

    def _block_slots(self, blocks: np.ndarray, block_size: int) -> Any:
        offsets = np.arange(block_size, dtype=np.int64)
        return self.rt.from_numpy((np.asarray(blocks, np.int64)[:, None] * block_size + offsets).reshape(-1))

    def read_kv_blocks(
        self, kv_caches: list[tuple[Any, Any]], blocks: np.ndarray, block_size: int
    ) -> list[np.ndarray]:
        slots = self._block_slots(blocks, block_size)
        wire = np.dtype(WIRE_DTYPES[self.dtype])
        arrays = []
        for layer in kv_caches:
            for cache in layer:
                host = self.rt.to_numpy(self.rt.index_select(cache, slots))  # float32 for 16-bit caches
                if self.dtype == "bfloat16":  # exact: the values are bfloat16
                    host = host.astype(ml_dtypes.bfloat16).view(wire)
                arrays.append(
                    np.ascontiguousarray(host.astype(wire)).reshape(len(blocks), block_size, *host.shape[1:])
                )
        return arrays

    def write_kv_blocks(
        self, kv_caches: list[tuple[Any, Any]], blocks: np.ndarray, arrays: list[np.ndarray], block_size: int
    ) -> None:
        slots = self._block_slots(blocks, block_size)
        caches = [cache for layer in kv_caches for cache in layer]
        for cache, array in zip(caches, arrays, strict=True):
            host = array.view(ml_dtypes.bfloat16) if self.dtype == "bfloat16" else array
            self.rt.index_copy_(cache, slots, self.from_numpy(host.reshape(-1, *host.shape[2:])))

    # --- data movement --------------------------------------------------------------------
    def from_numpy(self, array: np.ndarray) -> Any:
        if array.dtype.name == "bfloat16" or np.issubdtype(array.dtype, np.floating):
            return self.rt.from_numpy(np.asarray(array), self.dtype)
        return self.rt.from_numpy(np.asarray(array))

    def to_numpy(self, array: Any) -> np.ndarray:
        return self.rt.to_numpy(array)

    def _weight_part(self, part: Any) -> Any:
        """One host matrix on the device in the backend dtype; packed parts the kernels cannot
        read are dequantised on the host, float32/float16/bfloat16 arrays go over in their own
        dtype."""
        array = part if isinstance(part, np.ndarray) else np.asarray(part, dtype=np.float32)
        return self.rt.from_numpy(array, self.dtype)

    def _float_weight(self, parts: tuple[Any, ...]) -> Any:
        pieces = [self._weight_part(part) for part in parts]
        stacked = pieces[0] if len(pieces) == 1 else self.rt.concat(pieces, 0)
        return self.rt.permute(stacked, [1, 0]).contiguous()  # [in, out]: `linear` is one matmul

    def _count_weight(self, kind: str, nbytes: int) -> None:
        self.weight_bytes[kind] = self.weight_bytes.get(kind, 0) + nbytes

    def linear_weight(self, *parts: Any) -> Any:
        """[in, out] on the device; with the Triton kernels, `quantization=` weights (wint8, wint4,
        fp8) and GGUF Q8_0 / Q4_0 blocks stay packed (`quantized_linear`)."""
        packed = packed_parts(parts) if self.launch is not None else None
        if packed is not None and packed.format == "fp8" and self.quantization_refusal("fp8") is not None:
            packed = None  # an FP8 checkpoint on a GPU without e4m3: dequantised at load
        if packed is None:
            weight = self._float_weight(parts)
            out, inp = sum(int(np.shape(part)[0]) for part in parts), int(np.shape(parts[0])[1])
            self._count_weight(self.dtype, out * inp * (4 if self.dtype == "float32" else 2))
            return weight
        scales = self.rt.from_numpy(packed.scales) if packed.scales is not None else None
        nbytes = packed.weight.nbytes + (packed.scales.nbytes if packed.scales is not None else 0)
        self._count_weight(packed.format, nbytes)
        return QuantizedWeight(
            packed.format,
            self.rt.from_numpy(packed.weight),
            scales,
            packed.out_features,
            packed.in_features,
            packed.group_size,
            nbytes,
        )

    def loaded_weights_summary(self) -> str | None:
        if not self.weight_bytes:
            return None
        total = sum(self.weight_bytes.values())
        parts = ", ".join(
            f"{kind} {size / 2**20:.1f} MiB" for kind, size in sorted(self.weight_bytes.items())
        )
        return f"linear weights on {self.name}: {total / 2**30:.3f} GiB ({parts})"

    # --- quantisation -----------------------------------------------------------------------
    def supported_quantizations(self) -> tuple[str, ...]:
        """With the Triton kernels: wint8 and wint4, and fp8 on GPUs with FP8 tensor cores (and on
        the host, where the kernels run in Triton's interpreter). The reference kernels would only
        dequantise the weights: none."""
        if self.launch is None:
            return ()
        return QUANTIZATIONS if self.quantization_refusal("fp8") is None else QUANTIZATIONS[:2]

    def quantization_refusal(self, quantization: str) -> str | None:
        capability = self.rt.compute_capability()
        if quantization == "fp8" and capability is not None and capability < FP8_MIN_CAPABILITY:
            return (
                "quantization='fp8' needs FP8 tensor cores (compute capability 8.9, Ada, or newer); "
                f"this GPU is sm_{capability[0]}{capability[1]}"
            )
        return None

    def linear_bias(self, *parts: np.ndarray) -> Any:
        return self.from_numpy(np.concatenate([np.asarray(p, dtype=np.float32) for p in parts]))

    def prepare_batch(self, layout: BatchLayout) -> CudaBatch:
        slot_mapping = self.rt.from_numpy(layout.slot_mapping.astype(np.int64))
        if self.launch is None:
            meta = reference.build_reference_metadata(self.rt, self.dtype, build_metadata(layout))
            return CudaBatch(slot_mapping, layout.block_size, reference=meta)
        attention = self.launch.attention
        host = build_host_metadata(layout, attention.prefill_block_m(self.dtype == "float32"))
        batch = self.device_batch(host, layout.block_size, slot_mapping)
        batch.layout = layout
        return batch

    def device_batch(self, host: Any, block_size: int, slot_mapping: Any = None) -> CudaBatch:
        """Device copies of host metadata (the decode split count is fixed here)."""
        put = self.rt.from_numpy
        decodes = int(host.decode_token.shape[0])
        return CudaBatch(
            slot_mapping=slot_mapping if slot_mapping is not None else put(host.slot_mapping),
            block_size=block_size,
            block_tables=put(host.block_tables),
            seq_query_start=put(host.seq_query_start),
            seq_query_len=put(host.seq_query_len),
            seq_context_len=put(host.seq_context_len),
            tile_seq=put(host.tile_seq),
            tile_offset=put(host.tile_offset),
            decode_token=put(host.decode_token),
            decode_seq=put(host.decode_seq),
            num_prefill_tiles=int(host.tile_seq.shape[0]),
            num_decodes=decodes,
            num_splits=self.launch.attention.decode_splits(
                decodes, max(self.num_kv_heads, 1), host.max_context, self.num_sms
            ),
        )

    # --- ops --------------------------------------------------------------------------------
    def embedding(self, token_ids: Any, table: Any) -> Any:
        return self.rt.index_select(table, token_ids)

    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        out = (
            self._quantized_linear(x, weight)
            if isinstance(weight, QuantizedWeight)
            else self.rt.matmul(x, weight)
        )
        return out + bias if bias is not None else out

    def _quantized_linear(self, x: Any, weight: QuantizedWeight) -> Any:
        """x [rows, in] @ a packed weight with `triton_quant` (skinny launch for decode rows)."""
        quant = self.launch.quant
        rows = x.shape[0]
        x = x.contiguous()
        is_float32 = self.dtype == "float32"
        config = quant.matmul_config(
            weight.format,
            rows,
            weight.out_features,
            weight.in_features,
            self.num_sms,
            is_float32,
            weight.group_size,
        )
        shape = [rows, weight.out_features]
        split = config["SPLIT_K"] > 1
        out = self.rt.zeros(shape, "float32") if split else self.rt.empty(shape, self.dtype)
        self.launch(
            quant.quant_matmul,
            x,
            weight.weight,
            weight.scales,
            out,
            weight.format,
            weight.out_features,
            weight.in_features,
            config,
            weight.group_size,
        )
        return self.rt.cast(out, self.dtype) if split and not is_float32 else out

    def rms_norm(self, x: Any, weight: Any, eps: float, residual: Any | None = None) -> tuple[Any, Any]:
        if self.launch is None:
            return reference.rms_norm(self.rt, x, weight, eps, residual)
        x = x.contiguous()
        residual = residual.contiguous() if residual is not None else None
        out = self.rt.empty_like(x)
        new_residual = self.rt.empty_like(x) if residual is not None else x
        self.launch(self.launch.elementwise.rms_norm, x, weight, eps, residual, out, new_residual)
        return out, new_residual

    def rotary_embedding(self, x: Any, positions: Any, cos: Any, sin: Any) -> Any:
        if self.launch is None:
            return reference.rotary_embedding(self.rt, x, positions, cos, sin)
        x, token_stride = self.rt.token_rows(x)
        out = self.rt.empty(list(x.shape), self.rt.dtype_name(x))
        self.launch(self.launch.elementwise.rotary_embedding, x, positions, cos, sin, out, token_stride)
        return out

    def silu_and_mul(self, x: Any) -> Any:
        half = x.shape[-1] // 2
        if self.launch is None:
            return self.rt.silu(x[:, :half]) * x[:, half:]
        out = self.rt.empty([x.shape[0], half], self.rt.dtype_name(x))
        self.launch(self.launch.elementwise.silu_and_mul, x.contiguous(), out)
        return out

    def layer_norm(
        self, x: Any, weight: Any, bias: Any | None, eps: float, residual: Any | None = None
    ) -> tuple[Any, Any]:
        if residual is not None:
            x = x + residual
        return self.rt.layer_norm(x, weight, bias, eps), x

    def gelu_tanh(self, x: Any) -> Any:
        return self.rt.gelu_tanh(x)

    def attention(
        self, q: Any, k: Any, v: Any, kv_cache: tuple[Any, Any], batch: CudaBatch, scale: float
    ) -> Any:
        return self._paged_attention(q, k, v, kv_cache, batch, scale)

    def windowed_attention(
        self, q: Any, k: Any, v: Any, kv_cache: tuple[Any, Any], batch: CudaBatch, scale: float, window: int
    ) -> Any:
        """The same kernels with the window a kernel argument: prefill skips the key tiles
        before it, decode splits only the window (a captured graph replays it unchanged)."""
        return self._paged_attention(q, k, v, kv_cache, batch, scale, window=window)

    def attention_with_sinks(
        self,
        q: Any,
        k: Any,
        v: Any,
        kv_cache: tuple[Any, Any],
        batch: CudaBatch,
        scale: float,
        sinks: Any,
        window: int = 0,
    ) -> Any:
        """The sinks (a device tensor) join each softmax at its end, in the kernels."""
        return self._paged_attention(q, k, v, kv_cache, batch, scale, sinks, window)

    def softcapped_attention(
        self,
        q: Any,
        k: Any,
        v: Any,
        kv_cache: tuple[Any, Any],
        batch: CudaBatch,
        scale: float,
        softcap: float,
        window: int = 0,
    ) -> Any:
        """The kernels cap each score as it leaves the q.k product (the cap a kernel argument)."""
        return self._paged_attention(q, k, v, kv_cache, batch, scale, window=window, softcap=softcap)

    def softcap(self, x: Any, cap: float) -> Any:
        """On the device, in float32 (graph-safe: Gemma 2's logits are capped inside a captured
        decode step): cap * tanh(x / cap) = cap * (2 sigmoid(2x / cap) - 1)."""
        wide = self.rt.cast(x, "float32")
        capped = (self.rt.sigmoid(wide * (2.0 / cap)) * 2.0 - 1.0) * cap
        return self.rt.cast(capped, self.rt.dtype_name(x))

    def _paged_attention(
        self,
        q: Any,
        k: Any,
        v: Any,
        kv_cache: tuple[Any, Any],
        batch: CudaBatch,
        scale: float,
        sinks: Any = None,
        window: int = 0,
        softcap: float = 0.0,
    ) -> Any:
        key_cache, value_cache = kv_cache
        if self.launch is None:
            reference.store_kv(self.rt, k, v, key_cache, value_cache, batch.slot_mapping)
            return reference.paged_attention(
                self.rt, q, kv_cache, batch.reference, scale, sinks, window, softcap
            )
        q, k = q.contiguous(), k.contiguous()
        v, value_stride = self.rt.token_rows(v)  # read in place from the qkv projection
        launch = self.launch
        launch(launch.elementwise.store_kv, k, v, key_cache, value_cache, batch.slot_mapping, value_stride)
        out = self.rt.empty_like(q)
        common = (batch.block_tables,)
        if batch.num_prefill_tiles:
            launch(
                launch.attention.prefill_attention,
                q,
                key_cache,
                value_cache,
                out,
                *common,
                batch.seq_query_start,
                batch.seq_query_len,
                batch.seq_context_len,
                batch.tile_seq,
                batch.tile_offset,
                scale,
                batch.block_size,
                launch.shared_memory,
                sinks,
                window,
                softcap,
            )
        if batch.num_decodes:
            scratch = self._decode_scratch(batch, q.shape[1], q.shape[2])
            launch(
                launch.attention.decode_attention,
                q,
                key_cache,
                value_cache,
                out,
                *common,
                batch.decode_token,
                batch.decode_seq,
                batch.seq_context_len,
                scratch["out"],
                scratch["lse"],
                scale,
                batch.block_size,
                batch.num_splits,
                sinks,
                window,
                softcap,
            )
        return out

    def _decode_scratch(self, batch: CudaBatch, heads: int, head_dim: int) -> dict[str, Any]:
        if not batch.scratch:
            splits = batch.num_splits
            size = batch.num_decodes if splits > 1 else 1
            batch.scratch["out"] = self.rt.empty([size, heads, splits, head_dim], "float32")
            batch.scratch["lse"] = self.rt.empty([size, heads, splits], "float32")
        return batch.scratch

    def latent_attention(
        self,
        q_nope: Any,
        q_rope: Any,
        latent: Any,
        k_rope: Any,
        kv_cache: tuple[Any],
        batch: CudaBatch,
        absorb_k: Any,
        absorb_v: Any,
        scale: float,
    ) -> Any:
        """Absorbed decode in a Triton kernel over the paged latents, expanded prefill through
        the paged prefill kernel (`latent_attention`); framework ops with the reference kernels."""
        (store,) = kv_cache
        if self.launch is not None:
            return triton_latent_attention(
                self, q_nope, q_rope, latent, k_rope, store, batch, absorb_k, absorb_v, scale
            )
        self.rt.index_copy_(store, batch.slot_mapping, self.rt.concat([latent, k_rope], -1))
        return reference_latent_attention(
            self.rt, q_nope, q_rope, store, batch.reference, absorb_k, absorb_v, scale
        )

    def gather_rows(self, x: Any, indices: Any) -> Any:
        return self.rt.index_select(x, indices)

    # --- vision encoders (on the device; `Backend`'s defaults would run them on the host) --------
    def encoder_attention(self, q: Any, k: Any, v: Any, cu_seqlens: np.ndarray, scale: float) -> Any:
        """Segments of equal length (one image, or a video's frames) go as one batch to the
        runtime's unmasked attention; unequal ones one by one."""
        lengths = np.diff(np.asarray(cu_seqlens, dtype=np.int64))
        if lengths.size and (lengths == lengths[0]).all():
            groups = [(int(cu_seqlens[0]), int(lengths.size), int(lengths[0]))]
        else:
            groups = [
                (int(start), 1, int(length)) for start, length in zip(cu_seqlens[:-1], lengths, strict=True)
            ]
        heads, head_dim = q.shape[1], q.shape[2]
        outputs = []
        for start, segments, length in groups:
            end, shape = start + segments * length, [segments, length, heads, head_dim]
            # [segments, heads, length, head_dim] each
            batched = [self.rt.permute(t[start:end].reshape(shape), [0, 2, 1, 3]) for t in (q, k, v)]
            out = self.rt.bidirectional_attention(*batched, scale)
            outputs.append(self.rt.permute(out, [0, 2, 1, 3]).reshape([segments * length, heads, head_dim]))
        return outputs[0] if len(outputs) == 1 else self.rt.concat(outputs, 0)

    def quick_gelu(self, x: Any) -> Any:
        return x * self.rt.sigmoid(x * 1.702)

    def gelu(self, x: Any) -> Any:
        return self.rt.gelu(x)

    def merge_rows(self, parts: list[tuple[Any, np.ndarray]], num_rows: int) -> Any:
        first = parts[0][0]
        out = self.rt.empty([num_rows, *first.shape[1:]], self.rt.dtype_name(first))
        for rows, indices in parts:
            self.rt.index_copy_(out, self.rt.from_numpy(np.asarray(indices, dtype=np.int64)), rows)
        return out

    def argmax_rows(self, logits: Any) -> np.ndarray:
        return self.rt.to_numpy(self.rt.argmax_rows(logits)).astype(np.int64)

    def nonfinite_rows(self, logits: Any) -> np.ndarray:
        """Row maxima on the device: one value per row crosses, not the logits (at 256 rows of a
        152k vocabulary the whole copy cost more than the decode step). The maximum is exact in
        the logits' own dtype, so only the [rows] result is cast for the host."""
        return ~np.isfinite(self.rt.to_numpy(self._row_maxima(logits)))

    def _row_maxima(self, logits: Any) -> Any:
        return self.rt.cast(self.rt.max_rows(logits), "float32")

    def greedy_tokens(self, logits: Any) -> PendingTokens:
        """The argmax and the row maxima (`nonfinite_rows`) start for the host on the device's
        queue, behind this pass and ahead of the next one."""
        rt = self.rt
        tokens = rt.cast(rt.argmax_rows(logits), "int64")
        copied = rt.copy_to_host_later([tokens, self._row_maxima(logits)])

        def wait() -> tuple[np.ndarray, np.ndarray]:
            ids, maxima = copied()
            return ids.astype(np.int64), ~np.isfinite(maxima)

        return PendingTokens(tokens, wait)

    def feed_tokens(
        self, input_ids: np.ndarray, rows: np.ndarray, pending: PendingTokens, sources: np.ndarray
    ) -> Any:
        rt = self.rt
        ids = rt.from_numpy(np.asarray(input_ids, dtype=np.int64))
        picked = rt.index_select(pending.device, rt.from_numpy(np.asarray(sources, dtype=np.int64)))
        rt.index_copy_(ids, rt.from_numpy(np.asarray(rows, dtype=np.int64)), picked)
        return ids

    def decode_graphs(
        self, model: Any, kv_caches: list[Any], block_size: int, max_num_seqs: int, max_model_len: int
    ) -> DecodeGraphs | None:
        """Captured decode steps per batch-size bucket (on a GPU with the Triton kernels)."""
        if not self.on_gpu or self.launch is None:
            return None
        graphs = DecodeGraphs(self, model, kv_caches, block_size, max_num_seqs, max_model_len)
        graphs.capture()
        return graphs

    # --- mixture of experts -------------------------------------------------------------------
    def moe_route(
        self,
        router_logits: Any,
        top_k: int,
        correction_bias: Any | None = None,
        renormalize: bool = True,
        norm_min: float = 0.0,
    ) -> tuple[Any, Any]:
        if self.launch is None:
            return super().moe_route(router_logits, top_k, correction_bias, renormalize, norm_min)
        tokens = router_logits.shape[0]
        weights = self.rt.empty([tokens, top_k], "float32")
        ids = self.rt.empty([tokens, top_k], "int32")
        self.launch(
            self.launch.moe.moe_route,
            router_logits.contiguous(),
            correction_bias,
            weights,
            ids,
            top_k,
            renormalize,
            norm_min,
        )
        return weights, ids

    def moe_expert_weights(self, gate: list[np.ndarray], up: list[np.ndarray], down: list[np.ndarray]) -> Any:
        if self.launch is None:
            return super().moe_expert_weights(gate, up, down)
        quantised = self._quantised_experts(gate, up, down)
        if quantised is not None:
            return quantised
        width, hidden = np.shape(gate[0])
        gate_up = self.rt.empty([len(gate), hidden, 2 * width], self.dtype)
        down_stack = self.rt.empty([len(gate), width, hidden], self.dtype)
        for expert, (g, u, d) in enumerate(zip(gate, up, down, strict=True)):
            gate_up[expert] = self._float_weight((g, u))
            down_stack[expert] = self._float_weight((d,))
        item = 4 if self.dtype == "float32" else 2
        self._count_weight(self.dtype, len(gate) * 3 * width * hidden * item)
        return StackedExperts(gate_up, down_stack)

    def _quantised_experts(self, gate: list[Any], up: list[Any], down: list[Any]) -> StackedExperts | None:
        """wint8 / wint4 / fp8 experts stacked in their packed form (the MoE GEMMs dequantise in
        registers), or None when the experts are not all of one such kind (or fp8 ones whose
        gate rows do not fill whole 128-row blocks, or on a GPU without e4m3: dequantised then)."""
        parts = [*gate, *up, *down]
        if not all(isinstance(p, WeightOnlyTensor) for p in parts):
            return None
        if len({(p.kind, p.group_size) for p in parts}) != 1:
            return None
        kind = parts[0].kind
        if kind == "fp8" and self.quantization_refusal("fp8") is not None:
            return None
        fused = [concat_rows([g, u]) for g, u in zip(gate, up, strict=True)]
        if any(f is None for f in fused):
            return None
        if kind == "fp8":  # stored [out, in] like a linear weight; the MoE GEMM reads [in, out]
            arrays = {
                "gate_up": np.stack([f.qweight.T for f in fused]),
                "gate_up_scales": np.stack([f.scales.T for f in fused]),
                "down": np.stack([d.qweight.T for d in down]),
                "down_scales": np.stack([d.scales.T for d in down]),
            }
        else:
            arrays = {
                "gate_up": np.stack([f.qweight for f in fused]),
                "gate_up_scales": np.stack([f.scales for f in fused]),
                "down": np.stack([d.qweight for d in down]),
                "down_scales": np.stack([d.scales for d in down]),
            }
        self._count_weight(kind, sum(array.nbytes for array in arrays.values()))
        device = {name: self.rt.from_numpy(np.ascontiguousarray(array)) for name, array in arrays.items()}
        group_size = parts[0].group_size if kind == "wint4" else 0
        return StackedExperts(**device, group_size=group_size, fp8=kind == "fp8")

    def moe_experts(
        self, x: Any, experts: Any, topk_weights: Any, topk_ids: Any, first_expert: int = 0
    ) -> Any:
        if not isinstance(experts, StackedExperts):
            return super().moe_experts(x, experts, topk_weights, topk_ids, first_expert)
        moe = self.launch.moe
        tokens, top_k = topk_ids.shape[0], topk_ids.shape[1]
        num_experts, double_width, hidden = (
            experts.gate_up.shape[0],
            experts.gate_up.shape[2],
            experts.down.shape[2],
        )
        entries = tokens * top_k
        config = moe.gemm_config(entries, num_experts, self.dtype == "float32", self.launch.shared_memory)
        if experts.group_size:  # a wint4 K tile lies within one scale group
            config = dict(config, BLOCK_K=min(config["BLOCK_K"], experts.group_size))
        block_m = config["BLOCK_M"]
        max_sorted = moe.max_sorted_entries(entries, num_experts, block_m)
        sorted_ids = self.rt.empty([max_sorted], "int32")
        block_expert = self.rt.empty([-(-max_sorted // block_m)], "int32")
        cursor = self.rt.empty([num_experts], "int32")
        total = self.rt.empty([1], "int32")
        ids = topk_ids if self.rt.dtype_name(topk_ids) == "int32" else self.rt.cast(topk_ids, "int32")
        if first_expert:
            ids = ids - first_expert  # the kernels drop entries outside this rank's experts
        self.launch(
            moe.moe_align, ids.contiguous(), num_experts, block_m, sorted_ids, block_expert, cursor, total
        )
        x = x.contiguous()
        gate_up = self.rt.empty([entries, double_width], self.dtype)
        self.launch(
            moe.moe_gemm,
            x,
            experts.gate_up,
            gate_up,
            sorted_ids,
            block_expert,
            total,
            None,
            top_k,
            False,
            config,
            experts.gate_up_scales,
            experts.group_size,
            experts.fp8,
        )
        activated = self.silu_and_mul(gate_up)
        down = self.rt.zeros([entries, hidden], self.dtype)  # entries of other ranks' experts add 0
        routing = self.rt.cast(topk_weights, "float32").contiguous()
        self.launch(
            moe.moe_gemm,
            activated,
            experts.down,
            down,
            sorted_ids,
            block_expert,
            total,
            routing,
            top_k,
            True,
            config,
            experts.down_scales,
            experts.group_size,
            experts.fp8,
        )
        return self.rt.sum_rows(down.reshape([tokens, top_k, hidden]), 1)

    # --- LoRA: per adapter segment, one shrink and one expand matmul on the device --------------
    def lora_stack(
        self, slots: int, rank: int, in_features: int, out_features: int, parts: Sequence[int] = ()
    ) -> LoRAStack:
        return LoRAStack(
            self.rt.zeros([slots, in_features, rank], self.dtype),
            self.rt.zeros([slots, rank, out_features], self.dtype),
        )

    def set_lora_slot(self, stack: LoRAStack, slot: int, a: np.ndarray, b: np.ndarray) -> None:
        stack.a[slot] = self.rt.from_numpy(np.ascontiguousarray(a, np.float32), self.dtype)
        stack.b[slot] = self.rt.from_numpy(np.ascontiguousarray(b, np.float32), self.dtype)

    def lora_rows(self, token_slots: np.ndarray) -> CudaLoRARows:
        grouped = segments_by_slot(token_slots)
        rows = grouped.rows
        indices = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows
        starts = np.array([start for _, start, _ in grouped.segments] + [grouped.count], np.int64)
        put = self.rt.from_numpy
        return CudaLoRARows(
            grouped,
            put(indices.astype(np.int64)),
            put(starts),
            put(np.array([slot for slot, _, _ in grouped.segments], np.int64)),
            max((end - start for _, start, end in grouped.segments), default=0),
        )

    def add_lora(self, y: Any, x: Any, stack: LoRAStack, rows: CudaLoRARows) -> Any:
        """The Triton SGMV kernels (`triton_lora`): a shrink into the sorted rows, an expand
        added into y; the reference kernels' runtime matmuls per segment otherwise."""
        grouped, rt = rows.grouped, self.rt
        if not grouped.count:
            return y
        if self.launch is not None:
            shrunk = rt.empty([grouped.count, stack.a.shape[2]], self.dtype)
            sgmv = self.launch.lora.sgmv
            self.launch(
                sgmv,
                x.contiguous(),
                rows.indices,
                stack.a,
                shrunk,
                rows.starts,
                rows.slots,
                rows.longest,
                True,
            )
            self.launch(sgmv, shrunk, rows.indices, stack.b, y, rows.starts, rows.slots, rows.longest, False)
            return y
        picked = rt.index_select(x, rows.indices)
        deltas = [
            rt.matmul(rt.matmul(picked[start:end], stack.a[slot]), stack.b[slot])
            for slot, start, end in grouped.segments
        ]
        delta = deltas[0] if len(deltas) == 1 else rt.concat(deltas, 0)
        rt.index_copy_(y, rows.indices, rt.index_select(y, rows.indices) + delta)
        return y

    # --- guided decoding -----------------------------------------------------------------------
    def apply_token_bitmask(self, logits: Any, bitmask: np.ndarray, rows: np.ndarray) -> Any:
        """Unpacks the bitmask on the device (`token_bitmask`): only the packed bits cross over."""
        return self.token_bitmask.apply(logits, bitmask, rows)

    # --- sampling -----------------------------------------------------------------------------
    def sample_top_k_top_p(
        self,
        logits: Any,
        temperatures: np.ndarray,
        top_k: np.ndarray,
        top_p: np.ndarray,
        uniforms: np.ndarray,
    ) -> np.ndarray:
        temperatures = np.asarray(temperatures, dtype=np.float32)
        top_k = np.asarray(top_k, dtype=np.int32)
        top_p = np.asarray(top_p, dtype=np.float32)
        uniforms = np.asarray(uniforms, dtype=np.float32)
        if self.launch is None:
            host = self.rt.to_numpy(logits)
            return np.array(
                [
                    numpy_reference.sample_top_k_top_p(
                        host[i], temperatures[i], top_k[i], top_p[i], uniforms[i]
                    )
                    for i in range(host.shape[0])
                ],
                dtype=np.int64,
            )
        put = self.rt.from_numpy
        logits = self.rt.cast(logits, "float32").contiguous()
        out = self._draw(logits, put(temperatures), put(top_k), put(top_p), put(uniforms))
        tokens = self.rt.to_numpy(out)
        for row in np.flatnonzero(tokens < 0):  # rows whose kept set the candidates did not hold
            host_row = self.rt.to_numpy(logits[int(row)])
            tokens[row] = numpy_reference.sample_top_k_top_p(
                host_row, temperatures[row], top_k[row], top_p[row], uniforms[row]
            )
        return tokens

    def _draw(self, logits: Any, temperatures: Any, top_k: Any, top_p: Any, uniforms: Any) -> Any:
        """Device token ids [rows] int64 of the Triton top-k / top-p kernel over float32 logits
        (device parameters); -1 where the row must be sampled on the host."""
        sampling = self.launch.sampling
        rows, vocab = logits.shape[0], logits.shape[1]
        scratch = {
            name: (self.rt.zeros if name == "count" else self.rt.empty)(shape, dtype)
            for name, (shape, dtype) in sampling.scratch_shapes(rows, vocab).items()
        }
        out = self.rt.empty([rows], "int64")
        self.launch(sampling.sample_top_k_top_p, logits, temperatures, top_k, top_p, uniforms, out, scratch)
        return out

    def pass_tokens(self, logits: Any, rows: dict[str, Any], draws: bool) -> tuple[Any, Any]:
        """The tokens of a pass that samples itself, on the device without a host round trip:
        (ids [n] int64, pairs [n, 2] int64 of id and broken flag, the one thing the host reads).

        `rows` holds device [n] vectors: `greedy` (int64 1/0), `temperature` (1 on greedy rows),
        `top_k`, `top_p`, `uniform`. A greedy row takes the argmax; with `draws`, the others take
        the kernel's draw (-1: sample on the host). A row is broken where its maximum is not finite
        (`nonfinite_rows`: NaN, +inf, or only -inf), computed as max - max != 0.
        """
        rt = self.rt
        ids = rt.cast(rt.argmax_rows(logits), "int64")
        maxima = self._row_maxima(logits)
        broken = rt.cast((maxima - maxima) != 0, "int64")
        if draws:
            drawn = self._draw(
                rt.cast(logits, "float32").contiguous(),
                rows["temperature"],
                rows["top_k"],
                rows["top_p"],
                rows["uniform"],
            )
            greedy = rows["greedy"]
            ids = ids * greedy + drawn * (1 - greedy)
        count = logits.shape[0]
        return ids, rt.concat([ids.reshape([count, 1]), broken.reshape([count, 1])], 1)


class CudaBackend(TensorBackend):
    """An NVIDIA GPU with the Triton kernels; paddle or torch tensors (see `runtimes`)."""

    name = "cuda"
    auto_priority = 100
    on_gpu = True
    #: decode steps captured in CUDA graphs (with the Triton kernels; `decode_graphs` returns None
    #: with the reference kernels)
    capabilities = TensorBackend.capabilities | {Capability.GRAPH_CAPTURE}
    default_dtype = "bfloat16"
    #: vLLM's default for offline use on large GPUs: a step's kernel launches cost ~20 ms however
    #: few tokens it computes (measured on an H100: 8 x 2048-token prefills ran 90k tok/s at 2064
    #: tokens per step, 600k at 16400)
    default_max_num_batched_tokens = 16384

    @classmethod
    def unavailable_reason(cls) -> str | None:
        choice = choose_gpu_runtime()
        return choice.why if choice.name is None else None

    @classmethod
    def runtime_details(cls) -> str | None:
        choice = choose_gpu_runtime()
        version = torch_runtime.torch_description() if choice.name == "torch" else "paddlepaddle-gpu"
        return f"{choice.name} runtime ({version}): {choice.why}"

    @classmethod
    def default_communicator(cls) -> str:
        """NCCL through the framework that holds the tensors: paddle.distributed or torch.distributed."""
        return choose_gpu_runtime().name or "paddle"

    @classmethod
    def device_count(cls) -> int:
        return len(visible_gpus())

    @classmethod
    def rank_environment(cls, local_rank: int) -> dict[str, str]:
        """The rank with index `local_rank` on this host sees one GPU, that index of the visible ones,
        as its device 0 (`FLAGS_selected_gpus=0`: an inherited launcher choice must not point past it)."""
        return {"CUDA_VISIBLE_DEVICES": visible_gpus()[local_rank], "FLAGS_selected_gpus": "0"}

    @classmethod
    def resolve_default_dtype(cls) -> str:
        """bfloat16 where the GPU has it (compute capability 8.0+), float16 before."""
        choice = choose_gpu_runtime()
        module = paddle_runtime if choice.name == "paddle" else torch_runtime
        capability = module.gpu_capability()
        return "bfloat16" if capability >= BF16_MIN_CAPABILITY else "float16"


class PaddleCpuBackend(TensorBackend):
    """The cuda backend's code on Paddle's CPU place, for checking it without a GPU."""

    name = "paddle-cpu"
    auto_priority = -10
    runtime_name = "paddle"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return paddle_runtime.paddle_unavailable_reason()


class TorchCpuBackend(TensorBackend):
    """The cuda backend's code on torch CPU tensors, for checking the torch runtime without a GPU."""

    name = "torch-cpu"
    auto_priority = -10
    runtime_name = "torch"
    communicator = "torch"  # torch.distributed for its ranks (tensor / pipeline parallelism)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return torch_runtime.torch_unavailable_reason()
