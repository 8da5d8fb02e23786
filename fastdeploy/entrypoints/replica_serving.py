"""The server's side of parallelism: one engine or R replicas, and the hosts that only run ranks.

Engines are built from the engine options (`EngineConfig`) directly, as `LLM` builds its own.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from fastdeploy.backends.base import BackendOptions
from fastdeploy.config import EngineConfig, check_data_parallel_size
from fastdeploy.engine.async_engine import AsyncLLMEngine
from fastdeploy.engine.engine import LLMEngine
from fastdeploy.engine.runners import build_engine
from fastdeploy.entrypoints.replicas import ReplicaRouter
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.executor.placement import find_placement
from fastdeploy.executor.startup import serve_follower
from fastdeploy.logger import get_logger
from fastdeploy.plugins.registry import get_registry

logger = get_logger(__name__)


def build_replicas(
    options: dict[str, Any], data_parallel_size: int, max_waiting: int | None
) -> AsyncLLMEngine | ReplicaRouter:
    """One engine, or `data_parallel_size` engines behind a `ReplicaRouter`.

    `options` are `EngineConfig`'s. Each replica's model runs in rank processes of its own (so
    the replicas compute in parallel); without `cpu_threads`, a host's cores are divided among
    all replicas' ranks. The replicas are built side by side (their ranks load at the same time).
    """
    check_data_parallel_size(data_parallel_size)
    if data_parallel_size == 1:
        return AsyncLLMEngine(build_engine(EngineConfig(**options)), max_waiting=max_waiting)
    if options.get("runner") == "pooling":
        raise InvalidArgumentError("--data-parallel-size above 1 is not supported with --runner pooling")
    if options.get("ips"):
        raise InvalidArgumentError("--data-parallel-size above 1 with --ips (several hosts) is not supported")
    ranks = (options.get("tensor_parallel_size") or 1) * (options.get("pipeline_parallel_size") or 1)
    options = dict(options, distributed_executor_backend="mp")
    if options.get("cpu_threads") is None:
        options["cpu_threads"] = max(1, BackendOptions().thread_count() // (data_parallel_size * ranks))
    # every replica's options are checked before any loads
    configs = [EngineConfig(**options, data_parallel_rank=index) for index in range(data_parallel_size)]
    get_registry()  # loaded once, before the replicas are built side by side
    with ThreadPoolExecutor(data_parallel_size, thread_name_prefix="fastdeploy-replica") as pool:
        futures = [pool.submit(LLMEngine, config) for config in configs]
        wait(futures)
    failed = [future.exception() for future in futures if future.exception() is not None]
    if failed:
        for future in futures:
            if future.exception() is None:
                future.result().shutdown()
        raise failed[0]
    replicas = [AsyncLLMEngine(future.result(), max_waiting=max_waiting) for future in futures]
    logger.info("%d engine replicas of %d rank(s) each behind one endpoint", data_parallel_size, ranks)
    return ReplicaRouter(replicas, prefix_aware=replicas[0].engine.config.enable_prefix_caching)


def stop_replicas(engine: AsyncLLMEngine | ReplicaRouter) -> None:
    """Stop every replica's rank processes (after the engine threads have stopped)."""
    replicas = engine.replicas if isinstance(engine, ReplicaRouter) else [engine]
    for replica in replicas:
        replica.engine.shutdown()


def serve_follower_host(options: dict[str, Any]) -> int | None:
    """On a host of `--ips` other than the master: run this host's ranks until the master ends
    them and return their exit status; None on the master (or on one host)."""
    if not options.get("ips"):
        return None
    if find_placement(options["ips"], options.get("engine_worker_queue_port")).is_master:
        return None
    return serve_follower(EngineConfig(**options), get_registry())
