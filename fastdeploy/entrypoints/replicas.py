"""Data parallelism for the server: R engine replicas behind one endpoint.

`ReplicaRouter` has the interface of one `AsyncLLMEngine` (what the server's handlers use) and
sends each request to one replica: the one with the fewest requests in flight, except that with
prefix caching on, a request whose prompt starts like a recent one goes to the replica that
served it (whose prefix cache likely still holds those blocks) unless that replica is busier
than the least-loaded one by more than `prefix_slack` requests. Each replica is a whole engine
whose model runs in its own rank processes, so replicas compute in parallel.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastdeploy.engine.async_engine import AsyncLLMEngine, StepObserver, StepStats
from fastdeploy.engine.engine import LLMEngine
from fastdeploy.engine.prefix_cache_stats import PrefixCacheStats
from fastdeploy.engine.request import RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.spec_decode.decoder import SpecDecodeStats
from fastdeploy.load_balancing import LeastLoaded, PrefixAffinity


class ReplicaRouter:
    """Routes requests over several `AsyncLLMEngine`s and reports their combined statistics."""

    def __init__(self, replicas: list[AsyncLLMEngine], prefix_aware: bool, prefix_slack: int = 2) -> None:
        if not replicas:
            raise ValueError("a router needs at least one replica")
        self.replicas = replicas
        #: the first replica's engine: tokenizer, limits and prompt checks are the same for all
        self.engine: LLMEngine = replicas[0].engine
        self.prefix_aware = prefix_aware
        self.prefix_slack = prefix_slack
        self._owner: dict[str, AsyncLLMEngine] = {}
        self._least = LeastLoaded()
        self._affinity: PrefixAffinity[AsyncLLMEngine] | None = (
            PrefixAffinity(self.engine.config.block_size, slack=prefix_slack) if prefix_aware else None
        )
        self._latest: list[StepStats | None] = [None] * len(replicas)

    # --- lifecycle (the AsyncLLMEngine interface) -----------------------------------------
    def start(self) -> None:
        for replica in self.replicas:
            replica.start()

    def shutdown(self, timeout: float | None = 30.0) -> None:
        for replica in self.replicas:
            replica.shutdown(timeout)

    def on_fatal(self, callback: Callable[[BaseException], None]) -> None:
        for replica in self.replicas:
            replica.on_fatal(callback)

    def stop_accepting(self) -> None:
        for replica in self.replicas:
            replica.stop_accepting()

    def abort_all(self) -> None:
        for replica in self.replicas:
            replica.abort_all()

    def add_observer(self, observer: StepObserver) -> None:
        """`observer` sees each replica's step with the gauges (queues, KV usage), the prefix-cache
        and the speculative decoding totals summed over replicas."""
        for index, replica in enumerate(self.replicas):
            replica.add_observer(self._combining(index, observer))

    def _combining(self, index: int, observer: StepObserver) -> StepObserver:
        def combined(stats: StepStats) -> None:
            self._latest[index] = stats
            known = [latest for latest in self._latest if latest is not None]
            total_blocks = sum(latest.num_total_blocks for latest in known)
            free_blocks = sum(latest.num_free_blocks for latest in known)
            observer(
                StepStats(
                    num_running=sum(latest.num_running for latest in known),
                    num_waiting=sum(latest.num_waiting for latest in known),
                    kv_cache_usage=1.0 - free_blocks / total_blocks if total_blocks else 0.0,
                    num_free_blocks=free_blocks,
                    num_total_blocks=total_blocks,
                    requests_in_step=stats.requests_in_step,
                    prompt_tokens=stats.prompt_tokens,
                    generation_tokens=stats.generation_tokens,
                    first_token_latencies=stats.first_token_latencies,
                    inter_token_latencies=stats.inter_token_latencies,
                    finished=stats.finished,
                    prefix_cache=PrefixCacheStats.summed(latest.prefix_cache for latest in known),
                    spec_decode=SpecDecodeStats.summed(latest.spec_decode for latest in known),
                )
            )

        return combined

    @property
    def is_running(self) -> bool:
        return all(replica.is_running for replica in self.replicas)

    @property
    def fatal_error(self) -> BaseException | None:
        return next((r.fatal_error for r in self.replicas if r.fatal_error is not None), None)

    @property
    def is_accepting(self) -> bool:
        return all(replica.is_accepting for replica in self.replicas)

    @property
    def num_in_flight(self) -> int:
        return sum(replica.num_in_flight for replica in self.replicas)

    # --- requests ---------------------------------------------------------------------------
    def check_capacity(self, count: int = 1) -> None:
        """Raise unless the least-loaded replica can take `count` more requests."""
        self._least_loaded().check_capacity(count)

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, **kwargs: Any
    ) -> AsyncIterator[RequestOutput]:
        replica = self.route(prompt_token_ids)
        self._owner[request_id] = replica
        try:
            async for output in replica.generate(request_id, prompt_token_ids, params, **kwargs):
                yield output
        finally:
            self._owner.pop(request_id, None)

    def abort(self, request_id: str) -> None:
        replica = self._owner.get(request_id)
        if replica is not None:
            replica.abort(request_id)

    def route(self, prompt_token_ids: list[int]) -> AsyncLLMEngine:
        """The replica for a new request (see the module docstring)."""
        least = self._least_loaded()
        if self._affinity is None:
            return least
        return self._affinity.choose(prompt_token_ids, self.replicas, _in_flight, least)

    def _least_loaded(self) -> AsyncLLMEngine:
        return self._least.choose(self.replicas, _in_flight)


def _in_flight(replica: AsyncLLMEngine) -> int:
    return replica.num_in_flight
