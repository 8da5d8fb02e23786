"""The in-process executor: the model runner of this process, plus the device probe."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fastdeploy.backends.base import Backend, KVCacheSpec
from fastdeploy.model_executor.batch import ScheduledBatch
from fastdeploy.model_executor.lora.manager import LoRAManager
from fastdeploy.model_executor.model_runner import ModelRunner
from fastdeploy.models.base import CausalLM, KVCacheGroup


@dataclass
class _ProbeSequence:
    """What the batch layout reads of a sequence: one token at position 0 in block 0 of the
    probe cache, no extra (multimodal) inputs, no adapter."""

    token_ids: list[int] = field(default_factory=lambda: [0])
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=lambda: [0])
    extra_inputs: Any = None
    lora: None = None


class LocalExecutor(ModelRunner):
    """`ModelRunner.execute` on this process's backend; the probe runs on a one-block KV cache of
    its own, allocated on first use (nothing is reserved while all is well)."""

    def __init__(
        self,
        model: CausalLM,
        backend: Backend,
        kv_caches: list[Any],
        spec: KVCacheSpec,
        graphs: Any = None,
        lora: LoRAManager | None = None,
        kv_groups: list[KVCacheGroup] | None = None,
    ) -> None:
        super().__init__(model, backend, kv_caches, spec.block_size, graphs, lora, kv_groups)
        self._probe_spec = dataclasses.replace(spec, num_blocks=1)
        self._probe_caches: list[Any] | None = None

    def probe(self) -> Any:
        if self._probe_caches is None:
            self._probe_caches = self.backend.allocate_kv_cache(self._probe_spec)
        batch = ScheduledBatch()
        batch.add(_ProbeSequence(), 1)
        runner = ModelRunner(self.model, self.backend, self._probe_caches, self.block_size)
        return runner.execute(batch)[0]

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        return None
