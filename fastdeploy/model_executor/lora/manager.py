"""The resident adapters: `max_loras` device slots, filled least-recently-used first, and the
adapters read in host memory (`max_cpu_loras`, least recently used dropped first).

The scheduler never puts more than `max_loras` adapters in one pass, so every adapter of a pass
gets a slot: one that is free, else the least recently used slot no adapter of this pass holds.
An adapter waiting for a slot only waits (its requests are scheduled once one frees).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from fastdeploy.backends.base import Backend, Capability
from fastdeploy.backends.lora import LayerLoRA
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.batch import ScheduledBatch
from fastdeploy.model_executor.lora.adapter import LoRAWeights
from fastdeploy.model_executor.lora.gguf_adapter import read_adapter
from fastdeploy.model_executor.lora.request import LoRARequest
from fastdeploy.model_executor.rope import interleaved_to_half_rows
from fastdeploy.models.base import CausalLM, LoRAProjection

logger = get_logger(__name__)


class PackedAdapter:
    """An adapter checked against the model, in the fused projections' layout: per layer and
    projection a [in, parts * max_rank] and b [parts * max_rank, out] (part p's rank in columns /
    rows p * max_rank onwards, b block-diagonal, the scale in b)."""

    def __init__(
        self, request: LoRARequest, rank: int, layers: list[dict[str, tuple[np.ndarray, np.ndarray]]]
    ) -> None:
        self.request = request
        self.rank = rank
        self.layers = layers
        #: the projections it targets in some layer
        self.projections = frozenset(name for layer in layers for name in layer)


class LoRAManager:
    """Reads, checks and places adapters for one model on one backend."""

    def __init__(
        self, model: CausalLM, backend: Backend, max_loras: int, max_lora_rank: int, max_cpu_loras: int
    ) -> None:
        architecture = type(model).__name__
        if not backend.supports(Capability.LORA):
            raise InvalidArgumentError(
                f"enable_lora=True: the {backend.name} backend runs no LoRA adapters (it does not "
                "declare Capability.LORA)"
            )
        self.projections: dict[str, LoRAProjection] = model.lora_projections()
        if not self.projections:
            raise InvalidArgumentError(
                f"enable_lora=True: {architecture} takes no LoRA adapters here (supported: Llama-family "
                "decoders such as Llama, Mistral, Qwen2/3 and ERNIE-4.5, on one rank)"
            )
        self.model, self.backend, self.architecture = model, backend, architecture
        self.max_loras, self.max_lora_rank, self.max_cpu_loras = max_loras, max_lora_rank, max_cpu_loras
        self.num_layers = model.kv_cache_layers()
        #: [layer][projection] -> the device stack of every slot
        self.stacks = [
            {
                name: backend.lora_stack(
                    max_loras,
                    max_lora_rank * len(projection.parts),
                    projection.in_features,
                    sum(rows for _, rows in projection.parts),
                    tuple(rows for _, rows in projection.parts),
                )
                for name, projection in self.projections.items()
            }
            for _ in range(self.num_layers)
        ]
        self._part_of = {
            part: (name, index)
            for name, projection in self.projections.items()
            for index, (part, _) in enumerate(projection.parts)
        }
        #: adapter id -> slot, least recently used first
        self._slots: OrderedDict[int, int] = OrderedDict()
        self._free_slots = list(range(max_loras))
        #: adapter id -> the adapter read and packed, least recently used first
        self._read: OrderedDict[int, PackedAdapter] = OrderedDict()
        #: the server checks and removes adapters from its own threads while the engine steps
        self._lock = threading.RLock()

    # --- reading ------------------------------------------------------------------------------
    def check(self, request: LoRARequest) -> None:
        """Read `request`'s adapter (unless it is read already); InvalidArgumentError naming the
        adapter when it cannot run on this model."""
        with self._lock:
            self._adapter(request)

    def loaded(self) -> list[LoRARequest]:
        """The adapters read in host memory, least recently used first."""
        with self._lock:
            return [adapter.request for adapter in self._read.values()]

    def remove(self, lora_int_id: int) -> None:
        """Forget an adapter: a later request for its id reads its path again."""
        with self._lock:
            self._read.pop(lora_int_id, None)
            slot = self._slots.pop(lora_int_id, None)
            if slot is not None:
                self._free_slots.append(slot)

    def _adapter(self, request: LoRARequest) -> PackedAdapter:
        adapter = self._read.get(request.lora_int_id)
        if adapter is not None:
            if adapter.request.lora_path != request.lora_path:
                raise InvalidArgumentError(
                    f"lora_int_id {request.lora_int_id} already names adapter {adapter.request.lora_name!r} "
                    f"({adapter.request.lora_path}); give {request.lora_name!r} another id"
                )
            self._read.move_to_end(request.lora_int_id)
            return adapter
        adapter = self._pack(read_adapter(request))
        self._read[request.lora_int_id] = adapter
        while len(self._read) > self.max_cpu_loras:
            dropped = self._read.popitem(last=False)[1]
            logger.info("LoRA adapter %r dropped from host memory (max_cpu_loras)", dropped.request.lora_name)
        logger.info(
            "LoRA adapter %r read from %s (rank %d)", request.lora_name, request.lora_path, adapter.rank
        )
        return adapter

    def _pack(self, weights: LoRAWeights) -> PackedAdapter:
        """Check `weights` against the model and lay them out as the stacks are."""
        self._check_fits(weights)
        config, width = self.model.config, self.max_lora_rank
        layers: list[dict[str, tuple[np.ndarray, np.ndarray]]] = [{} for _ in range(self.num_layers)]
        for (layer, module), (a, b, scale) in weights.modules.items():
            name, index = self._part_of[module]
            projection = self.projections[name]
            if name not in layers[layer]:
                outs = sum(rows for _, rows in projection.parts)
                layers[layer][name] = (
                    np.zeros((projection.in_features, width * len(projection.parts)), np.float32),
                    np.zeros((width * len(projection.parts), outs), np.float32),
                )
            if weights.interleaved_qk and module in ("q_proj", "k_proj"):
                heads = config.num_attention_heads if module == "q_proj" else config.num_key_value_heads
                b = interleaved_to_half_rows(b, heads)
            b = np.asarray(self.model.lora_b_rows(module, b), dtype=np.float32)
            first_row = sum(rows for _, rows in projection.parts[:index])
            rank = a.shape[0]
            stacked_a, stacked_b = layers[layer][name]
            stacked_a[:, index * width : index * width + rank] = a.T
            stacked_b[index * width : index * width + rank, first_row : first_row + b.shape[0]] = (
                b * np.float32(scale)
            ).T
        return PackedAdapter(weights.request, weights.rank, layers)

    def _check_fits(self, weights: LoRAWeights) -> None:
        """Rank, target modules, layers and shapes against this model and `max_lora_rank`."""
        known = sorted(self._part_of)
        lacking = sorted(
            {module for _, module in weights.modules if module not in self._part_of}
            | {t for t in weights.targets if t.isidentifier() and t not in self._part_of}
        )
        if lacking:
            raise weights.refuse(
                f"targets {', '.join(lacking)}, which {self.architecture} lacks here (its LoRA targets: "
                f"{', '.join(known)})"
            )
        if weights.rank > self.max_lora_rank:
            raise weights.refuse(
                f"rank {weights.rank} is above max_lora_rank={self.max_lora_rank}; raise max_lora_rank"
            )
        base = f" (it was made for {weights.base_model})" if weights.base_model else ""
        outs = {part: rows for p in self.projections.values() for part, rows in p.parts}
        for (layer, module), (a, b, _) in weights.modules.items():
            projection = self.projections[self._part_of[module][0]]
            if layer >= self.num_layers:
                raise weights.refuse(
                    f"has weights for layer {layer}, but the model has {self.num_layers} layers: "
                    f"it does not match this base model{base}"
                )
            expected_a, expected_b = (a.shape[0], projection.in_features), (outs[module], a.shape[0])
            if a.shape != expected_a or b.shape != expected_b:
                raise weights.refuse(
                    f"layer {layer}'s {module} has A {list(a.shape)} and B {list(b.shape)}, where this model "
                    f"needs A {list(expected_a)} and B {list(expected_b)}: it does not match this base "
                    f"model{base}"
                )

    # --- passes -------------------------------------------------------------------------------
    def pass_layers(self, batch: ScheduledBatch) -> list[LayerLoRA] | None:
        """The model's `lora=` argument for `batch` (None when no sequence has an adapter): each
        adapter of the pass placed in a slot, and each token row's slot."""
        requests = {seq.lora.lora_int_id: seq.lora for seq in batch.seqs if seq.lora is not None}
        if not requests:
            return None
        with self._lock:
            adapters = [self._adapter(request) for request in requests.values()]
            slots = self._place(adapters)
        per_seq = [-1 if seq.lora is None else slots[seq.lora.lora_int_id] for seq in batch.seqs]
        token_slots = np.repeat(np.asarray(per_seq, np.int64), np.asarray(batch.num_new_tokens, np.int64))
        rows = self.backend.lora_rows(token_slots)
        used = frozenset().union(*(adapter.projections for adapter in adapters))
        return [
            LayerLoRA({name: stack for name, stack in layer.items() if name in used}, rows)
            for layer in self.stacks
        ]

    def _place(self, adapters: Sequence[PackedAdapter]) -> dict[int, int]:
        """A slot for each adapter (at most `max_loras` of them): theirs if resident, else a free
        one, else the least recently used one no adapter here holds."""
        needed = {adapter.request.lora_int_id for adapter in adapters}
        for adapter in adapters:
            key = adapter.request.lora_int_id
            if key in self._slots:
                self._slots.move_to_end(key)
                continue
            if self._free_slots:
                slot = self._free_slots.pop(0)
            else:
                evicted = next(other for other in self._slots if other not in needed)
                slot = self._slots.pop(evicted)
            self._write(slot, adapter)
            self._slots[key] = slot
        return {key: self._slots[key] for key in needed}

    def _write(self, slot: int, adapter: PackedAdapter) -> None:
        for layer, stacks in zip(adapter.layers, self.stacks, strict=True):
            for name, stack in stacks.items():
                a, b = layer.get(name) or self._zeros(name)
                self.backend.set_lora_slot(stack, slot, a, b)

    def _zeros(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        projection = self.projections[name]
        width = self.max_lora_rank * len(projection.parts)
        outs = sum(rows for _, rows in projection.parts)
        return np.zeros((projection.in_features, width), np.float32), np.zeros((width, outs), np.float32)

    def resident(self) -> dict[int, int]:
        """Adapter id -> slot of the adapters on the device, least recently used first."""
        return dict(self._slots)
