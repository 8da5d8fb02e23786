"""Checks a parallel configuration against the model and the machines, then starts the ranks.

Everything that can be known before a process starts is checked here, so a size the model or
the hosts cannot take fails at construction, with the numbers, in well under a second.
"""

from __future__ import annotations

from fastdeploy.backends.base import Backend
from fastdeploy.backends.selection import select_backend_class
from fastdeploy.config import EngineConfig
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.executor.placement import Placement, check_placement, find_placement
from fastdeploy.executor.rank_executor import DistributedExecutor
from fastdeploy.model_executor.model_loader import CheckpointInfo, model_class
from fastdeploy.model_resolver import DEFAULT_MODEL
from fastdeploy.parallel.selection import communicator_class
from fastdeploy.parallel.topology import ParallelLayout, check_layout
from fastdeploy.plugins.registry import PluginRegistry


def parallel_layout(config: EngineConfig) -> ParallelLayout:
    return ParallelLayout(config.tensor_parallel_size, config.pipeline_parallel_size)


def check_deployment(
    config: EngineConfig, registry: PluginRegistry
) -> tuple[ParallelLayout, Placement, type[Backend]]:
    """The layout, this host's placement and the backend class, once they are known to fit."""
    layout = parallel_layout(config)
    backend_class = select_backend_class(config.device, registry)
    placement = find_placement(config.ips, config.engine_worker_queue_port)
    check_placement(placement, layout, backend_class.device_count(), backend_class.name)
    if layout.distributed:
        communicator_class(backend_class, registry)
    return layout, placement, backend_class


def start_executor(
    config: EngineConfig,
    checkpoint: CheckpointInfo,
    max_model_len: int,
    max_num_batched_tokens: int,
    registry: PluginRegistry,
) -> DistributedExecutor:
    """Start the ranks of the master host (they load while the caller reads the tokenizer)."""
    layout, placement, backend_class = check_deployment(config, registry)
    name = config.model or DEFAULT_MODEL
    check_layout(layout, checkpoint.config, name)
    if layout.distributed and not model_class(checkpoint, registry).supports_parallel:
        raise InvalidArgumentError(
            f"architecture {checkpoint.config.architecture} does not support tensor or pipeline "
            f"parallelism (its class does not declare supports_parallel); use tensor_parallel_size=1 "
            "and pipeline_parallel_size=1"
        )
    return DistributedExecutor(
        config, checkpoint.path, layout, placement, backend_class, max_model_len, max_num_batched_tokens
    )


def serve_follower(config: EngineConfig, registry: PluginRegistry) -> int:
    """On a host other than the master: start this host's ranks and wait until the master ends
    them; the exit status of their launcher."""
    layout, placement, backend_class = check_deployment(config, registry)
    executor = DistributedExecutor(config, "", layout, placement, backend_class, 0, 0)
    try:
        return executor.wait_for_launcher()
    finally:
        executor.shutdown()
