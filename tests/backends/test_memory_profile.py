"""KV-cache sizing after a profiling run (the cuda backend's gpu_memory_utilization)."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.backends.base import BackendOptions, KVCacheSpec
from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.conformance.checkpoint import tiny_llama
from fastdeploy.backends.cuda.memory import kv_cache_budget
from fastdeploy.backends.profiling import dummy_forward, profile_layout, profiled_kv_cache_budget
from fastdeploy.config import ModelConfig
from fastdeploy.errors import InvalidArgumentError

GIB = 2**30


class FakeMemory:
    """A device with `total` bytes; the profiled forward pass raises the peak to `peak`."""

    def __init__(self, total: int, weights: int, peak: int) -> None:
        self._total, self._allocated, self._peak_during_run = total, weights, peak
        self._peak = weights
        self.calls: list[str] = []

    def total(self) -> int:
        return self._total

    def allocated(self) -> int:
        return self._allocated

    def free(self) -> int:
        return self._total - self._allocated

    def reset_peak(self) -> None:
        self.calls.append("reset")
        self._peak = self._allocated

    def peak(self) -> int:
        return self._peak

    def synchronize(self) -> None:
        self.calls.append("sync")

    def run(self) -> None:
        self.calls.append("forward")
        self._peak = self._peak_during_run


def test_budget_is_utilization_of_total_minus_profiled_peak():
    memory = FakeMemory(total=80 * GIB, weights=2 * GIB, peak=5 * GIB)
    budget = kv_cache_budget(memory, 0.9, memory.run)
    assert budget == int(80 * GIB * 0.9) - 5 * GIB  # 67 GiB
    assert memory.calls == ["sync", "reset", "forward", "sync"]


def test_budget_refuses_when_nothing_is_left():
    memory = FakeMemory(total=8 * GIB, weights=6 * GIB, peak=7 * GIB)
    with pytest.raises(InvalidArgumentError, match="gpu_memory_utilization=0.5 leaves no memory"):
        kv_cache_budget(memory, 0.5, memory.run)


def test_profile_layout_is_one_prefill_over_consecutive_blocks():
    layout = profile_layout(10, 4, max_model_len=64)
    assert layout.block_tables.tolist() == [[0, 1, 2]]
    assert layout.slot_mapping.tolist() == list(range(10))
    assert layout.query_lens.tolist() == [10] and layout.logits_indices.tolist() == [9]


def test_profile_layout_keeps_positions_inside_the_model_length():
    """More tokens than max_model_len: sequences of max_model_len, each in its own blocks (a
    position past the model length would read past the rotary table)."""
    layout = profile_layout(11, 4, max_model_len=5)
    assert layout.query_lens.tolist() == [5, 5, 1] and layout.context_lens.tolist() == [5, 5, 1]
    assert layout.positions.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0]
    assert layout.block_tables.tolist() == [[0, 1], [2, 3], [4, 5]]
    # slot = block_tables[seq][pos // 4] * 4 + pos % 4
    assert layout.slot_mapping.tolist() == [0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 16]
    assert layout.logits_indices.tolist() == [4, 9, 10]


SPEC = KVCacheSpec(num_layers=2, num_blocks=0, block_size=4, num_kv_heads=2, head_dim=16)


def _tiny_model(device: str, directory: str, max_model_len: int):
    """(backend, model, config, weights): the tiny Llama on `device`."""
    if device != "cpu":
        framework = device.split("-")[0]
        pytest.importorskip(framework, reason=f"{device} needs {framework} (the test extra installs it)")
    from fastdeploy.backends.conformance import build_backend
    from fastdeploy.models.llama import LlamaForCausalLM

    config, weights = tiny_llama(directory)
    backend = build_backend(device)
    model = LlamaForCausalLM(ModelConfig.from_hf_dict(config), backend, max_model_len)
    model.load_weights(weights.items())
    return backend, model, config, weights


@pytest.mark.parametrize("device", ["cpu", "paddle-cpu", "torch-cpu"])
def test_dummy_forward_runs_the_model_and_cuda_budget_uses_it(device, tmp_path):
    backend, model, config, weights = _tiny_model(device, str(tmp_path), 64)
    spec = SPEC
    logits = backend.to_numpy(dummy_forward(model, backend, 11, spec, 64))
    expected = ref.llama_logits(weights, config, [0] * 11)[-1:]
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    if device != "cpu":
        assert backend.kv_cache_budget_bytes(0.9, lambda: None) is None  # host memory: planner's rule
        backend.memory = FakeMemory(total=16 * GIB, weights=GIB, peak=GIB)
        ran = []
        budget = backend.kv_cache_budget_bytes(
            0.5, lambda: ran.append(dummy_forward(model, backend, 11, spec, 64))
        )
        assert len(ran) == 1 and budget == 7 * GIB
        assert profiled_kv_cache_budget(model, backend, spec, 0.75, 11, 64) == 11 * GIB
    else:
        assert profiled_kv_cache_budget(model, backend, spec, 0.75, 11, 64) is None


@pytest.mark.parametrize("device", ["cpu", "torch-cpu"])
def test_dummy_forward_over_more_tokens_than_the_model_length(device, tmp_path):
    """11 tokens with max_model_len 8: a sequence of 8 and one of 3, logits of both last rows."""
    backend, model, config, weights = _tiny_model(device, str(tmp_path), 8)
    logits = backend.to_numpy(dummy_forward(model, backend, 11, SPEC, 8))
    expected = [ref.llama_logits(weights, config, [0] * n)[-1] for n in (8, 3)]
    np.testing.assert_allclose(logits, np.stack(expected), rtol=1e-4, atol=1e-4)


def test_cpu_backend_leaves_sizing_to_the_planner():
    from fastdeploy.backends.cpu.backend import CpuBackend

    calls = []
    assert CpuBackend(BackendOptions(threads=1)).kv_cache_budget_bytes(0.5, lambda: calls.append(1)) is None
    assert calls == []
