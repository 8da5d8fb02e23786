"""What the engine expects of a model class registered through `fastdeploy_model_architectures`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fastdeploy.backends.base import Backend, KVCacheSpec
from fastdeploy.config import ModelConfig
from fastdeploy.errors import WeightLoadError
from fastdeploy.parallel.model_parallel import ModelParallel


@dataclass(frozen=True)
class LoRAProjection:
    """A (fused) linear layer of every decoder layer that LoRA adapters may target: its input
    width and its parts, by the module names adapters use, with each part's output rows in the
    order the fused weight stacks them."""

    in_features: int
    parts: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one KV pool and one block table per sequence: those attending over the
    same span. `window` > 0: each query sees only its last `window` positions, so the block manager
    frees the group's blocks behind it; 0: the whole context, every block kept."""

    window: int
    #: indexes into `forward`'s `kv_caches` (this process's layers), ascending
    layers: tuple[int, ...]


class CausalLM(ABC):
    """A decoder-only language model written against `Backend` ops.

    Built as `cls(config, backend, max_positions)`, then `load_weights` once; the model runner
    calls `forward` per step and `compute_logits` on the rows it samples from.

    Classes that can be split over ranks set `supports_parallel = True` and are built with
    `parallel=` (their rank's `ModelParallel`); the others run with tensor and pipeline parallel
    sizes of 1 only, and asking for more is an error naming the architecture.
    """

    #: whether the class takes `parallel=` and shards itself (tensor / pipeline parallelism)
    supports_parallel: bool = False
    #: whether a backend may capture its decode steps in device graphs (CUDA graphs): `forward`
    #: must then read no device value on the host and build no per-step host data
    supports_decode_graphs: bool = True

    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        max_positions: int,
        parallel: ModelParallel | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.max_positions = max_positions
        self.parallel = parallel or ModelParallel.single()

    @abstractmethod
    def load_weights(self, tensors: Iterable[tuple[str, Any]]) -> None:
        """Take (HF name, host array) pairs; raise WeightLoadError naming missing/unknown tensors."""

    @abstractmethod
    def forward(self, input_ids: Any, positions: Any, batch: Any, kv_caches: list[Any]) -> Any:
        """Final hidden states [num_tokens, hidden] for one flattened batch (None on a pipeline
        stage other than the last, which hands its activations on instead)."""

    def kv_cache_layers(self) -> int:
        """Decoder layers whose KV cache this process holds (its pipeline stage's)."""
        return self.config.num_hidden_layers

    def kv_cache_heads(self) -> int:
        """KV heads this process caches (its tensor-parallel shard)."""
        return self.config.num_key_value_heads

    def kv_window(self) -> int:
        """The sliding window every layer attends over (0: some layer sees the whole context):
        the block manager then releases the blocks behind it."""
        return 0

    def kv_cache_groups(self) -> list[KVCacheGroup]:
        """This process's layers grouped by the span they attend over, the whole-context group
        first (default: one group of every layer, with `kv_window`). A model returning several
        gives each layer its group's prepared batch in `forward` (`layer_batch`): the engine then
        keeps a KV pool and a block table per group, and the sliding groups hold only their window."""
        return [KVCacheGroup(self.kv_window(), tuple(range(self.kv_cache_layers())))]

    def kv_cache_spec(self, num_blocks: int, block_size: int, dtype: str) -> KVCacheSpec:
        """The KV cache this process holds: a key and a value of `head_dim` per KV head of its
        layers (`kv_cache_layers`, `kv_cache_heads`). A model with another cache (multi-head
        latent attention's one latent vector per token) returns its own kind."""
        return KVCacheSpec(
            self.kv_cache_layers(), num_blocks, block_size, self.kv_cache_heads(), self.config.head_dim, dtype
        )

    @abstractmethod
    def compute_logits(self, hidden: Any) -> Any:
        """Logits [rows, vocab] for the given hidden-state rows."""

    def lora_projections(self) -> dict[str, LoRAProjection]:
        """The projections LoRA adapters may target, by the name `forward`'s `lora=` layers use
        for their stacks; empty (the default) where the model runs no adapters. A model that
        returns some takes `forward(..., lora=[LayerLoRA per layer])`."""
        return {}

    def lora_b_rows(self, part: str, b: Any) -> Any:
        """An adapter's B [out, rank] of projection part `part` with its rows in this model's
        layout of that weight (e.g. q/k rows reordered for rotary); default unchanged."""
        return b


class WeightShapeError(WeightLoadError):
    """Tensors whose shapes are not the ones the configuration implies; `wrong` holds (name, shape,
    expected shape) of each, so the weight loader can say where they lie in its format."""

    def __init__(self, message: str, wrong: list[tuple[str, tuple[int, ...], tuple[int, ...]]]) -> None:
        super().__init__(message)
        self.wrong = wrong


def check_weight_shapes(expected: Mapping[str, tuple[int, ...]], host: Mapping[str, Any]) -> None:
    """Raise WeightShapeError naming the tensors whose shape is not the one config.json implies
    (caught here, a wrong size would fail only in the first forward pass, deep in an op)."""
    wrong = [
        (name, tuple(host[name].shape), tuple(shape))
        for name, shape in expected.items()
        if name in host and tuple(host[name].shape) != tuple(shape)
    ]
    if wrong:
        more = f" (and {len(wrong) - 4} more)" if len(wrong) > 4 else ""
        described = "; ".join(
            f"{name} is {shape}, config.json implies {want}" for name, shape, want in wrong[:4]
        )
        raise WeightShapeError("checkpoint does not match its config.json: " + described + more, wrong)


def check_weight_names(expected: set[str], provided: set[str], ignorable: tuple[str, ...] = ()) -> None:
    """Raise WeightLoadError listing tensors the checkpoint lacks or has beyond the model's."""
    missing = sorted(expected - provided)
    unexpected = sorted(name for name in provided - expected if not name.endswith(ignorable))
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        problems.append(
            f"unknown tensors: {', '.join(unexpected[:8])}{' ...' if len(unexpected) > 8 else ''}"
        )
    if problems:
        raise WeightLoadError("checkpoint does not match the model: " + "; ".join(problems))
