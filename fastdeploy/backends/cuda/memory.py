"""GPU memory accounting for the cuda backend: sizing the KV cache after a profiling run.

FastDeploy and vLLM size the cache the same way: the engine may use `gpu_memory_utilization` of
the device's total memory; the weights and the peak activation memory of the largest batch it
will schedule (measured by running that batch once) come off the top, the KV cache gets the
rest. Measuring beats estimating: activation peaks depend on kernels, dtype and the allocator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.logger import get_logger

logger = get_logger(__name__)


class DeviceMemory(Protocol):
    """What the budget needs to know about a device's memory (an interface, for testing too)."""

    def total(self) -> int: ...
    def allocated(self) -> int: ...
    def free(self) -> int: ...
    def reset_peak(self) -> None: ...
    def peak(self) -> int: ...
    def synchronize(self) -> None: ...


def kv_cache_budget(memory: DeviceMemory, utilization: float, profile_forward: Callable[[], Any]) -> int:
    """Bytes for the KV cache: utilization x total, minus the peak seen while profiling.

    The peak includes everything allocated at the time (the weights) plus the forward pass's
    activations, so it is exactly the memory the cache must leave free.
    """
    memory.synchronize()
    weights = memory.allocated()
    memory.reset_peak()
    profile_forward()
    memory.synchronize()
    peak = max(memory.peak(), weights)
    total = memory.total()
    budget = int(total * utilization) - peak
    logger.info(
        "memory profile: total %.2f GiB x utilization %.2f, weights %.2f GiB, peak with activations "
        "%.2f GiB -> KV cache %.2f GiB",
        total / 2**30,
        utilization,
        weights / 2**30,
        peak / 2**30,
        max(budget, 0) / 2**30,
    )
    if budget <= 0:
        raise InvalidArgumentError(
            f"gpu_memory_utilization={utilization} leaves no memory for the KV cache: the weights and "
            f"activations need {peak / 2**30:.2f} GiB of {total / 2**30:.2f} GiB; raise "
            "gpu_memory_utilization or lower max_num_batched_tokens"
        )
    return budget
