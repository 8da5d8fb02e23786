"""The cpu backend: numpy arrays, the BLAS numpy links against, host memory for the KV cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from fastdeploy import envs
from fastdeploy.backends import fused, portable
from fastdeploy.backends.base import Backend
from fastdeploy.backends.capabilities import Capability
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.attention import (
    CpuAttentionMetadata,
    build_metadata,
    paged_attention,
)
from fastdeploy.backends.cpu.host_memory import (
    available_host_memory,
    physical_host_memory,
    retain_freed_memory,
)
from fastdeploy.backends.cpu.kv_cache import (
    KV_TYPES,
    LatentKVCache,
    LayerKVCache,
    allocate_latent,
    allocate_native,
    allocate_numpy,
    read_blocks,
    write_blocks,
)
from fastdeploy.backends.cpu.latent_attention import latent_attention
from fastdeploy.backends.cpu.native.weight_arena import WeightArena
from fastdeploy.backends.cpu.native.weight_cache import WeightCache
from fastdeploy.backends.fused import AttentionBlock, MLPBlock
from fastdeploy.backends.lora import LoRASegments, LoRAStack, segments_by_slot
from fastdeploy.backends.portable import apply_token_bitmask_numpy
from fastdeploy.backends.types import BackendOptions, BatchLayout, KVCacheSpec
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.logger import get_logger

logger = get_logger(__name__)


#: the `dtype`s the cpu backend takes: float32 everywhere, or bfloat16 products in the linear layers
MATMUL_DTYPES = ("float32", "bfloat16")


def _set_blas_threads(count: int) -> None:
    """Limit the BLAS pool numpy uses."""
    threadpool_limits(limits=count, user_api="blas")


def _native_isa() -> str | None:
    """The instruction set of the native kernels `FD_CPU_KERNELS` asks for; None for numpy only."""
    requested = envs.cpu_kernels()
    choices = ("auto", *native.ISAS, "numpy")
    if requested not in choices:
        raise InvalidArgumentError(f"FD_CPU_KERNELS must be one of {', '.join(choices)}; got {requested!r}")
    if requested == "numpy":
        return None
    reason = native.unavailable_reason()
    if reason is None and requested == "avx512" and native.best_isa() != "avx512":
        reason = "this CPU has no AVX-512"
    if reason is not None:
        if requested != "auto":
            raise InvalidArgumentError(f"FD_CPU_KERNELS={requested} cannot run: {reason}")
        logger.info("cpu backend: native kernels off (%s); quantised weights are dequantised", reason)
        return None
    return native.best_isa() if requested == "auto" else requested


def _opt_in(variable: str, value: str, allowed: tuple[str, ...], isa: str | None) -> str:
    """`value` of the opt-in numerics setting `variable`, checked against its `allowed` values (the
    first is the exact default) and the kernels that will run (the others need the native ones)."""
    if value not in allowed:
        raise InvalidArgumentError(f"{variable} must be one of {', '.join(allowed)}; got {value!r}")
    if value != allowed[0] and isa is None:
        raise InvalidArgumentError(
            f"{variable}={value} needs the cpu backend's native kernels, which do not run here "
            f"({native.unavailable_reason() or 'FD_CPU_KERNELS=numpy'})"
        )
    return value


def _activations(isa: str | None) -> str:
    """What `FD_CPU_ACTIVATIONS` asks for."""
    return _opt_in("FD_CPU_ACTIVATIONS", envs.cpu_activations(), native.ACTIVATIONS, isa)


def _int8_dots(isa: str | None) -> str:
    """What `FD_CPU_INT8_DOTS` asks for."""
    return _opt_in("FD_CPU_INT8_DOTS", envs.cpu_int8_dots(), native.INT8_DOTS, isa)


def _vision_matmul(isa: str | None) -> str:
    """What `FD_CPU_VISION_MATMUL` asks for."""
    return _opt_in("FD_CPU_VISION_MATMUL", envs.cpu_vision_matmul(), native.VISION_MATMULS, isa)


def _vision_note(isa: str, vision_matmul: str) -> str:
    if vision_matmul == "float32":
        return "vision encoder matmuls in float32 (exact)"
    instructions = (
        "AVX512_BF16"
        if isa == "avx512" and native.has_bf16()
        else "widened to float32: no faster than float32"
    )
    return f"vision encoder matmuls in bfloat16 ({instructions}; FD_CPU_VISION_MATMUL)"


def _matmul_note(isa: str, matmul_dtype: str) -> str:
    if matmul_dtype == "float32":
        return "float32"
    if isa == "avx512" and native.has_bf16():
        instructions = "AVX512_BF16"
    else:
        instructions = "widened to float32: no faster than float32"
    return f"float32 with bfloat16 matmuls ({instructions}; dtype='bfloat16')"


def _activations_note(isa: str, activations: str) -> str:
    if activations == "float32":
        return "float32 activations (exact)"
    instructions = {"maddubs": "AVX2 maddubs", "avx-vnni": "AVX-VNNI", "avx512-vnni": "AVX-512 VNNI"}
    dots = native.int8_dots(isa, _int8_dots(isa))
    return f"int8 activations ({instructions[dots]}; FD_CPU_ACTIVATIONS, FD_CPU_INT8_DOTS)"


def _waiting_policy(adaptive: bool) -> str:
    """How the kernels' threads wait and how many run, for logs and `fastdeploy env`."""
    spin = envs.cpu_spin_us()
    waits = f"spin {spin:g} us, then sleep" if spin else "sleep at once"
    count = (
        "thread count adapts to the load (FD_CPU_ADAPTIVE_THREADS)"
        if adaptive
        else "fixed thread count (FD_CPU_THREADS given or FD_CPU_ADAPTIVE_THREADS=0)"
    )
    return (
        f"idle threads {waits} (FD_CPU_SPIN_US); loops never wait for a thread that has not started; {count}"
    )


@dataclass(frozen=True)
class CpuLoRARows:
    """A pass's adapter rows (`segments_by_slot`) and, when its segments are of similar length,
    their batched form: `padded` [segments, longest] pass rows (a short segment repeats its
    first row), `slots` the segments' slots (a slice when consecutive), `targets` the pass row
    of each real entry of the flattened batch and `real` those entries (None: all are)."""

    grouped: LoRASegments
    padded: np.ndarray | None = None
    slots: slice | np.ndarray | None = None
    targets: np.ndarray | None = None
    real: np.ndarray | None = None

    @classmethod
    def of(cls, grouped: LoRASegments) -> CpuLoRARows:
        if not grouped.count:
            return cls(grouped)
        lengths = [end - start for _, start, end in grouped.segments]
        longest = max(lengths)
        if len(lengths) > 1 and len(lengths) * longest > 2 * grouped.count:
            return cls(grouped)  # padding would more than double the work
        rows = grouped.rows
        order = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows
        padded = np.empty((len(lengths), longest), np.int64)
        for index, (_, start, end) in enumerate(grouped.segments):
            padded[index, : end - start] = order[start:end]
            padded[index, end - start :] = order[start]
        slot_ids = [slot for slot, _, _ in grouped.segments]
        consecutive = slot_ids == list(range(slot_ids[0], slot_ids[0] + len(slot_ids)))
        slots = slice(slot_ids[0], slot_ids[-1] + 1) if consecutive else np.array(slot_ids, np.int64)
        real = None
        if min(lengths) != longest:
            real = np.concatenate([index * longest + np.arange(n) for index, n in enumerate(lengths)])
        targets = padded.reshape(-1) if real is None else padded.reshape(-1)[real]
        return cls(grouped, padded, slots, targets, real)


class CpuBackend(Backend):
    """Runs models with numpy on the host CPU; always available."""

    name = "cpu"
    auto_priority = 0
    capabilities = frozenset(
        {
            Capability.TOKEN_BITMASK,
            Capability.KV_BLOCK_COPY,
            Capability.KV_BLOCK_TRANSFER,
            Capability.FUSED_DECODER_LAYERS,
            Capability.FUSED_MOE,
            Capability.DEVICE_ROW_REDUCTIONS,
            Capability.VISION_OPS,
            Capability.LORA,
            Capability.SLIDING_WINDOW,
            Capability.LATENT_ATTENTION,
            Capability.QUANTIZED_WEIGHTS,
            Capability.ATTENTION_SINKS,
            Capability.ATTENTION_SOFTCAP,
        }
    )
    # logits are host arrays here: the portable reductions are this backend's own
    argmax_rows = portable.argmax_rows
    nonfinite_rows = portable.nonfinite_rows

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        if options.dtype not in MATMUL_DTYPES:
            raise InvalidArgumentError(
                f"the cpu backend computes in float32, with its matmuls optionally in bfloat16; "
                f"dtype={options.dtype!r} is not supported (one of: {', '.join(MATMUL_DTYPES)})"
            )
        if options.threads is not None and options.threads < 1:
            raise InvalidArgumentError(f"threads must be >= 1, got {options.threads}")
        self.threads = options.thread_count()
        # an explicit count is used as given; the default one follows the load (thread_adapt.c)
        self.adaptive_threads = options.threads is None and envs.cpu_adaptive_threads()
        self.dtype = np.float32
        self.native_isa = _native_isa()
        if options.dtype == "bfloat16" and self.native_isa is None:
            raise InvalidArgumentError(
                "dtype='bfloat16' on the cpu backend needs its native kernels, which do not run here "
                f"({native.unavailable_reason() or 'FD_CPU_KERNELS=numpy'}); use dtype='float32'"
            )
        #: what the linear layers of float checkpoints multiply in: float32 (exact) or bfloat16
        #: (`dtype="bfloat16"`: weights and activations rounded to bfloat16, float32 sums); norms,
        #: attention and everything else stay float32
        self.matmul_dtype = options.dtype
        self.activations = _activations(self.native_isa)
        self.int8_dots = _int8_dots(self.native_isa)
        #: packed weights on huge pages (native kernels only: the numpy path keeps numpy's arrays)
        self.weight_arena = WeightArena()
        #: GGUF weights repacked (and embeddings dequantised) at an earlier start
        cache_dir = envs.weight_cache_dir() if self.native_isa else None
        cache_limit = envs.weight_cache_max_bytes()  # checked even where unused: a typo is refused
        self.weight_cache = (
            WeightCache(cache_dir, native.build_stamp(), cache_limit) if cache_dir and cache_limit else None
        )
        self.vision_matmul = _vision_matmul(self.native_isa)
        #: (layers, kv_caches, native handle) of the latest `decoder_layers` run
        self._decoder_stack: tuple[Any, Any, object] | None = None
        # With the native kernels every op of a forward pass runs on their threads and BLAS is not
        # used; a BLAS pool would only spin beside them (measured: 170 -> 26 tok/s).
        _set_blas_threads(1 if self.native_isa else self.threads)
        retain_freed_memory()
        if self.native_isa:
            native.set_spin_us(envs.cpu_spin_us())
            native.set_adaptive_threads(self.adaptive_threads)
            native.cap_int8_dots(self.int8_dots)

    @classmethod
    def runtime_details(cls) -> str:
        try:
            isa = _native_isa()
            if isa is None:
                return f"numpy kernels ({native.unavailable_reason() or 'FD_CPU_KERNELS=numpy'})"
            adaptive = envs.cpu_threads() is None and envs.cpu_adaptive_threads()
            notes = f"{_activations_note(isa, _activations(isa))}; {_vision_note(isa, _vision_matmul(isa))}"
            return f"native kernels, {isa}; {notes}; {_waiting_policy(adaptive)}"
        except InvalidArgumentError as exc:
            return str(exc)

    def describe(self) -> str:
        kernels = (
            f"native kernels ({self.native_isa}; {'/'.join(native.SUPPORTED_TYPES)} weights kept in blocks; "
            f"{_activations_note(self.native_isa, self.activations)}; "
            f"{_vision_note(self.native_isa, self.vision_matmul)}; {_waiting_policy(self.adaptive_threads)})"
            if self.native_isa
            else "numpy"
        )
        precision = _matmul_note(self.native_isa, self.matmul_dtype) if self.native_isa else "float32"
        return f"cpu (numpy {np.__version__}, {self.threads} threads, {precision}, {kernels})"

    def supported_quantizations(self) -> tuple[str, ...]:
        # the native kernels multiply by Q8_0 / Q4_1 blocks; the numpy path would only dequantise them
        return ("wint8", "wint4") if self.native_isa else ()

    @classmethod
    def weight_layout(cls, quantization: str) -> str:
        # with int8 activations, wint8 as FastDeploy's (a scale per output channel): gemm_w8a8.c
        # multiplies it at ~2x the rate of Q8_0 blocks' int8 products (float work every 32 inputs),
        # on input widths that are multiples of 32; otherwise GGML blocks
        if quantization == "wint8" and envs.cpu_activations() == "int8":
            return "weight_only_32"
        return cls.weight_packing

    def free_memory_bytes(self) -> int:
        return available_host_memory()

    def total_memory_bytes(self) -> int:
        return physical_host_memory()

    def supported_kv_cache_dtypes(self) -> tuple[str, ...]:
        return tuple(KV_TYPES)

    def allocate_kv_cache(self, spec: KVCacheSpec) -> list[LayerKVCache] | list[LatentKVCache]:
        if spec.kind == "latent":
            slots = spec.num_blocks * spec.block_size
            return [allocate_latent(slots, spec.head_dim, spec.dtype) for _ in range(spec.num_layers)]
        if self.native_isa:
            layer = (spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim, spec.dtype)
            return [allocate_native(*layer) for _ in range(spec.num_layers)]
        layer = (spec.num_blocks * spec.block_size, spec.num_kv_heads, spec.head_dim, spec.dtype)
        return [allocate_numpy(*layer) for _ in range(spec.num_layers)]

    def copy_kv_blocks(self, kv_caches: list[LayerKVCache], pairs: np.ndarray, block_size: int) -> None:
        source, destination = pairs[:, 0], pairs[:, 1]
        for layer in kv_caches:
            if isinstance(layer, LatentKVCache):  # [slots, width] on both paths
                blocks = layer.latent.reshape(-1, block_size, layer.latent.shape[1])
                blocks[destination] = blocks[source]
                continue
            for cache in layer:  # keys, values and (int8 only, else empty) their scales
                if not cache.size:
                    continue
                # native layout: blocks lead; numpy layout: [blocks * block_size, ...] slots
                blocks = cache if self.native_isa else cache.reshape(-1, block_size, *cache.shape[1:])
                blocks[destination] = blocks[source]

    def read_kv_blocks(
        self, kv_caches: list[LayerKVCache], blocks: np.ndarray, block_size: int
    ) -> list[np.ndarray]:
        native = bool(self.native_isa)
        return [array for layer in kv_caches for array in read_blocks(layer, blocks, block_size, native)]

    def write_kv_blocks(
        self, kv_caches: list[LayerKVCache], blocks: np.ndarray, arrays: list[np.ndarray], block_size: int
    ) -> None:
        native = bool(self.native_isa)
        per_layer = len(arrays) // len(kv_caches)
        for index, layer in enumerate(kv_caches):
            write_blocks(
                layer, blocks, arrays[index * per_layer : (index + 1) * per_layer], block_size, native
            )

    def from_numpy(self, array: np.ndarray) -> np.ndarray:
        if isinstance(array, GGMLTensor) and self.weight_cache is not None:
            return self.weight_cache.dequantized(array)  # a GGUF embedding table
        if np.issubdtype(array.dtype, np.floating):
            return np.ascontiguousarray(array, dtype=self.dtype)
        return np.ascontiguousarray(array)

    def to_numpy(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def linear_weight(self, *parts: np.ndarray | GGMLTensor) -> np.ndarray | native.PackedWeight:
        if self.native_isa:
            if self.matmul_dtype == "bfloat16" and not native.keeps_blocks(parts):
                return native.pack_bf16(parts, self.weight_arena)
            return native.pack(parts, self.activations, self.weight_arena, self.weight_cache)
        stacked = np.concatenate([np.asarray(part, dtype=self.dtype) for part in parts], axis=0)
        # [in, out] contiguous: x @ W runs as a plain (non-transposed) sgemm.
        return np.ascontiguousarray(stacked.T)

    def encoder_linear_weight(self, *parts: np.ndarray | GGMLTensor) -> np.ndarray | native.PackedWeight:
        if self.vision_matmul == "bfloat16":
            return native.pack_bf16(parts, self.weight_arena)
        return self.linear_weight(*parts)

    def linear_bias(self, *parts: np.ndarray) -> np.ndarray:
        return np.concatenate(parts).astype(self.dtype)

    def prepare_batch(self, layout: BatchLayout) -> CpuAttentionMetadata | native.AttentionBatch:
        if not self.native_isa:
            return build_metadata(layout)
        if self.adaptive_threads:
            native.set_step_shape(len(layout.input_ids), len(layout.query_lens))
        return native.attention_batch(layout)

    def embedding(self, token_ids: np.ndarray, table: np.ndarray) -> np.ndarray:
        return table[token_ids]

    def linear(
        self, x: np.ndarray, weight: np.ndarray | native.PackedWeight, bias: np.ndarray | None = None
    ) -> np.ndarray:
        if isinstance(weight, native.PackedWeight):
            return native.matmul(x, weight, self.native_isa, self.threads, bias)
        out = x @ weight
        if bias is not None:
            out += bias
        return out

    def rms_norm(
        self, x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.native_isa:
            return native.rms_norm(x, weight, eps, residual, self.native_isa, self.threads)
        if residual is not None:
            x = x + residual
        variance = np.einsum("ij,ij->i", x, x) / np.float32(x.shape[-1])
        scale = 1.0 / np.sqrt(variance + np.float32(eps), dtype=np.float32)
        return (x * scale[:, None]) * weight, x

    def rotary_embedding(
        self, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray
    ) -> np.ndarray:
        if self.native_isa:
            return native.rotary_embedding(x, positions, cos, sin, self.native_isa, self.threads)
        rotary_dim = cos.shape[-1] * 2
        half = rotary_dim // 2
        cos_rows = cos[positions][:, None, :]
        sin_rows = sin[positions][:, None, :]
        first, second = x[..., :half], x[..., half:rotary_dim]
        out = np.empty_like(x)
        out[..., :half] = first * cos_rows - second * sin_rows
        out[..., half:rotary_dim] = second * cos_rows + first * sin_rows
        if rotary_dim < x.shape[-1]:
            out[..., rotary_dim:] = x[..., rotary_dim:]
        return out

    def silu_and_mul(self, x: np.ndarray) -> np.ndarray:
        if self.native_isa:
            return native.silu_and_mul(x, self.native_isa, self.threads)
        half = x.shape[-1] // 2
        gate, up = x[:, :half], x[:, half:]
        # sigmoid through tanh: no overflow warnings for large negative gates.
        sigmoid = np.tanh(gate * np.float32(0.5))
        sigmoid += np.float32(1.0)
        sigmoid *= np.float32(0.5)
        return gate * sigmoid * up

    def attention_block(
        self,
        x: np.ndarray,
        residual: np.ndarray | None,
        block: AttentionBlock,
        positions: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
        batch: CpuAttentionMetadata | native.AttentionBatch,
        kv_cache: LayerKVCache,
    ) -> tuple[np.ndarray, np.ndarray]:
        if not self.native_isa or block.sinks is not None:
            # the native layer has no sinks: op by op, through `attention_with_sinks`
            return fused.attention_block(self, x, residual, block, positions, cos, sin, batch, kv_cache)
        return native.attention_block(
            x, residual, block, positions, cos, sin, kv_cache, batch, self.native_isa, self.threads
        )

    def mlp_block(
        self, x: np.ndarray, residual: np.ndarray | None, block: MLPBlock
    ) -> tuple[np.ndarray, np.ndarray]:
        if not self.native_isa:
            return super().mlp_block(x, residual, block)
        return native.mlp_block(x, residual, block, self.native_isa, self.threads)

    def decoder_layers(
        self,
        x: np.ndarray,
        residual: np.ndarray | None,
        layers: Sequence[tuple[AttentionBlock, MLPBlock]],
        positions: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
        batch: CpuAttentionMetadata | native.AttentionBatch,
        kv_caches: Sequence[LayerKVCache],
    ) -> tuple[np.ndarray, np.ndarray]:
        """One native call a pass (decoder_layer.c); the layers' weights and caches are parsed once
        and kept for the latest `layers`/`kv_caches` pair (a probe pass on other caches replaces it);
        layers with attention sinks run layer by layer (the native layers have none)."""
        if not self.native_isa or any(attention.sinks is not None for attention, _ in layers):
            return super().decoder_layers(x, residual, layers, positions, cos, sin, batch, kv_caches)
        held = self._decoder_stack
        if held is None or held[0] is not layers or held[1] is not kv_caches:
            held = self._decoder_stack = (layers, kv_caches, native.prepare_decoder_stack(layers, kv_caches))
        return native.decoder_stack(
            x, residual, held[2], positions, cos, sin, batch, self.native_isa, self.threads
        )

    def layer_norm(
        self,
        x: np.ndarray,
        weight: np.ndarray,
        bias: np.ndarray | None,
        eps: float,
        residual: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.native_isa:
            return native.layer_norm(x, weight, bias, eps, residual, self.native_isa, self.threads)
        if residual is not None:
            x = x + residual
        mean = x.mean(axis=-1, keepdims=True, dtype=np.float32)
        centered = x - mean
        variance = np.einsum("ij,ij->i", centered, centered) / np.float32(x.shape[-1])
        scale = 1.0 / np.sqrt(variance + np.float32(eps), dtype=np.float32)
        out = centered * scale[:, None] * weight
        if bias is not None:
            out += bias
        return out, x

    def quick_gelu(self, x: np.ndarray) -> np.ndarray:
        if self.native_isa:
            return native.activation(x, "quick_gelu", self.native_isa, self.threads)
        return super().quick_gelu(x)

    def gelu(self, x: np.ndarray) -> np.ndarray:
        if self.native_isa:
            return native.activation(x, "gelu_erf", self.native_isa, self.threads)
        return super().gelu(x)

    def gelu_tanh(self, x: np.ndarray) -> np.ndarray:
        inner = np.float32(np.sqrt(2.0 / np.pi)) * (x + np.float32(0.044715) * x * x * x)
        return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))

    def attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        kv_cache: LayerKVCache,
        batch: CpuAttentionMetadata,
        scale: float,
    ) -> np.ndarray:
        if self.native_isa:
            return native.attention(q, k, v, kv_cache, batch, scale, self.native_isa, self.threads)
        return paged_attention(q, k, v, kv_cache, batch, scale)

    def windowed_attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        kv_cache: LayerKVCache,
        batch: CpuAttentionMetadata,
        scale: float,
        window: int,
    ) -> np.ndarray:
        if self.native_isa:
            return native.attention(q, k, v, kv_cache, batch, scale, self.native_isa, self.threads, window)
        return paged_attention(q, k, v, kv_cache, batch, scale, window=window)

    def softcapped_attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        kv_cache: LayerKVCache,
        batch: CpuAttentionMetadata,
        scale: float,
        softcap: float,
        window: int = 0,
    ) -> np.ndarray:
        if self.native_isa:
            return native.attention(
                q, k, v, kv_cache, batch, scale, self.native_isa, self.threads, window, softcap
            )
        return paged_attention(q, k, v, kv_cache, batch, scale, window=window, softcap=softcap)

    def latent_attention(
        self,
        q_nope: np.ndarray,
        q_rope: np.ndarray,
        latent: np.ndarray,
        k_rope: np.ndarray,
        kv_cache: LatentKVCache,
        batch: CpuAttentionMetadata | native.AttentionBatch,
        absorb_k: np.ndarray,
        absorb_v: np.ndarray,
        scale: float,
    ) -> np.ndarray:
        return latent_attention(q_nope, q_rope, latent, k_rope, kv_cache, batch, absorb_k, absorb_v, scale)

    def attention_with_sinks(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        kv_cache: LayerKVCache,
        batch: CpuAttentionMetadata,
        scale: float,
        sinks: np.ndarray,
        window: int = 0,
    ) -> np.ndarray:
        if not self.native_isa:
            return paged_attention(q, k, v, kv_cache, batch, scale, sinks=sinks, window=window)
        # the attention kernels' softmax has no sinks: their output, scaled by each query head's
        # sink factor (a second native pass over the cached keys)
        if window:
            out = native.attention(q, k, v, kv_cache, batch, scale, self.native_isa, self.threads, window)
        else:
            out = native.attention(q, k, v, kv_cache, batch, scale, self.native_isa, self.threads)
        out *= native.attention_sink_factors(q, kv_cache, batch, scale, sinks, self.threads, window)
        return out

    def encoder_attention(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens: np.ndarray, scale: float
    ) -> np.ndarray:
        if self.native_isa:
            bf16 = self.vision_matmul == "bfloat16"
            return native.encoder_attention(q, k, v, cu_seqlens, scale, self.native_isa, self.threads, bf16)
        return super().encoder_attention(q, k, v, cu_seqlens, scale)

    def encoder_attention_qkv(
        self,
        qkv: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
        cu_seqlens: np.ndarray,
        heads: int,
        scale: float,
    ) -> np.ndarray:
        if not self.native_isa or qkv.shape[1] % (3 * heads):
            return super().encoder_attention_qkv(qkv, cos, sin, cu_seqlens, heads, scale)
        bf16 = self.vision_matmul == "bfloat16"
        out = native.encoder_attention_qkv(
            qkv, cos, sin, cu_seqlens, heads, scale, self.native_isa, self.threads, bf16
        )
        return out.reshape(qkv.shape[0], -1)

    def gather_rows(self, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        return x[indices]

    # --- LoRA: numpy products (ranks are small), batched over the adapters of a pass; B by the
    # blocks of a fused projection's parts (its zeros are never read) --------------------------
    def lora_stack(
        self, slots: int, rank: int, in_features: int, out_features: int, parts: Sequence[int] = ()
    ) -> LoRAStack:
        widths = tuple(parts) or (out_features,)
        part_rank = rank // len(widths)
        blocks = []
        for index, width in enumerate(widths):
            first_column = sum(widths[:index])
            columns = slice(first_column, first_column + width)
            ranks = slice(index * part_rank, (index + 1) * part_rank)
            blocks.append((ranks, columns, np.zeros((slots, part_rank, width), np.float32)))
        return LoRAStack(np.zeros((slots, in_features, rank), np.float32), blocks)

    def set_lora_slot(self, stack: LoRAStack, slot: int, a: np.ndarray, b: np.ndarray) -> None:
        stack.a[slot] = a
        for ranks, columns, block in stack.b:
            block[slot] = b[ranks, columns]

    def lora_rows(self, token_slots: np.ndarray) -> CpuLoRARows:
        return CpuLoRARows.of(segments_by_slot(token_slots))

    def add_lora(self, y: np.ndarray, x: np.ndarray, stack: LoRAStack, rows: CpuLoRARows) -> np.ndarray:
        """Segments of similar length (decode steps): every adapter's shrink and expand in one
        batched matmul each (a few numpy calls per projection, whatever the adapters); uneven
        ones (a long prompt beside decodes): one product pair per segment."""
        grouped = rows.grouped
        if not grouped.count:
            return y
        if rows.padded is not None:
            shrunk = np.matmul(x[rows.padded], stack.a[rows.slots])
            delta = np.empty((*shrunk.shape[:2], y.shape[1]), np.float32)
            for ranks, columns, block in stack.b:
                np.matmul(shrunk[..., ranks], block[rows.slots], out=delta[..., columns])
            delta = delta.reshape(-1, y.shape[1])
            y[rows.targets] += delta if rows.real is None else delta[rows.real]
            return y
        picked = x[grouped.rows]
        delta = np.empty((grouped.count, y.shape[1]), np.float32)
        for slot, start, end in grouped.segments:
            shrunk = picked[start:end] @ stack.a[slot]
            for ranks, columns, block in stack.b:
                np.matmul(shrunk[:, ranks], block[slot], out=delta[start:end, columns])
        y[grouped.rows] += delta
        return y

    def apply_token_bitmask(self, logits: np.ndarray, bitmask: np.ndarray, rows: np.ndarray) -> np.ndarray:
        apply_token_bitmask_numpy(logits, bitmask, rows)  # logits are host arrays: in place, no copy
        return logits

    def moe_route(
        self,
        router_logits: np.ndarray,
        top_k: int,
        correction_bias: np.ndarray | None = None,
        renormalize: bool = True,
        norm_min: float = 0.0,
    ) -> tuple[np.ndarray, np.ndarray]:
        probs = np.exp(router_logits - router_logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        scores = probs if correction_bias is None else probs + correction_bias.reshape(1, -1)
        if top_k < scores.shape[-1]:
            # the k best in any order, then sorted by score (argpartition is O(experts))
            ids = np.argpartition(-scores, top_k - 1, axis=-1)[:, :top_k]
            ids = np.take_along_axis(ids, np.argsort(-np.take_along_axis(scores, ids, -1), axis=-1), -1)
        else:
            ids = np.argsort(-scores, axis=-1)
        weights = np.take_along_axis(probs, ids, axis=-1)
        if renormalize:
            weights /= np.maximum(weights.sum(axis=-1, keepdims=True), np.float32(norm_min))
        return weights.astype(np.float32, copy=False), ids.astype(np.int64, copy=False)

    def moe_experts(
        self,
        x: np.ndarray,
        experts: list[tuple[np.ndarray, np.ndarray]],
        topk_weights: np.ndarray,
        topk_ids: np.ndarray,
        first_expert: int = 0,
    ) -> np.ndarray:
        tokens, top_k = topk_ids.shape
        flat = topk_ids.reshape(-1)
        if first_expert or len(experts) <= int(flat.max(initial=0)):
            # expert parallel: pairs routed to other ranks' experts go to one bin past the end
            flat = flat - first_expert
            flat = np.where((flat >= 0) & (flat < len(experts)), flat, len(experts))
        # (token, k) pairs sorted by expert: each expert's tokens are one contiguous slice
        order = np.argsort(flat, kind="stable")
        counts = np.bincount(flat, minlength=len(experts))
        rows = order // top_k
        outputs = np.empty((order.size, x.shape[1]), dtype=np.float32)
        start = 0
        for expert in np.flatnonzero(counts[: len(experts)]):
            end = start + int(counts[expert])
            gate_up, down = experts[expert]
            outputs[start:end] = self.linear(
                self.silu_and_mul(self.linear(x[rows[start:end]], gate_up)), down
            )
            start = end
        outputs[start:] = 0.0  # pairs of other ranks' experts (sorted last)
        outputs *= topk_weights.reshape(-1)[order][:, None]
        unsorted = np.empty_like(outputs)
        unsorted[order] = outputs
        return unsorted.reshape(tokens, top_k, -1).sum(axis=1)
