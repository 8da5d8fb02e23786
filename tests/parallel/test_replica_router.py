"""The data-parallel router's choices, on stand-in replicas (no engines, no processes)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from fastdeploy.engine.async_engine import StepStats
from fastdeploy.engine.prefix_cache_stats import PrefixCacheStats
from fastdeploy.engine.spec_decode.decoder import SpecDecodeStats
from fastdeploy.entrypoints.replicas import ReplicaRouter


class FakeReplica:
    """Counts requests in flight like AsyncLLMEngine; `generate` yields once and records the call."""

    def __init__(self, block_size: int = 4) -> None:
        self.engine = SimpleNamespace(config=SimpleNamespace(block_size=block_size))
        self.num_in_flight = 0
        self.served: list[str] = []
        self.aborted: list[str] = []
        self.observers = []

    async def generate(self, request_id, prompt_token_ids, params, **kwargs):
        self.served.append(request_id)
        yield request_id

    def abort(self, request_id):
        self.aborted.append(request_id)

    def add_observer(self, observer):
        self.observers.append(observer)


def test_requests_go_to_the_replica_with_fewest_in_flight():
    replicas = [FakeReplica(), FakeReplica(), FakeReplica()]
    router = ReplicaRouter(replicas, prefix_aware=False)
    replicas[0].num_in_flight, replicas[1].num_in_flight, replicas[2].num_in_flight = 3, 1, 2
    assert router.route([1, 2, 3]) is replicas[1]
    replicas[1].num_in_flight = 5
    assert router.route([1, 2, 3]) is replicas[2]


def test_ties_rotate_so_idle_replicas_share_the_work():
    replicas = [FakeReplica(), FakeReplica()]
    router = ReplicaRouter(replicas, prefix_aware=False)
    assert [router.route([7]) for _ in range(4)] == [replicas[0], replicas[1], replicas[0], replicas[1]]


def test_a_shared_prefix_goes_back_to_its_replica_unless_that_one_is_much_busier():
    replicas = [FakeReplica(block_size=4), FakeReplica(block_size=4)]
    router = ReplicaRouter(replicas, prefix_aware=True, prefix_slack=2)
    system_prompt = [9, 9, 9, 9, 8, 8, 8, 8]
    first = router.route(system_prompt + [1, 2])
    other = replicas[1] if first is replicas[0] else replicas[0]
    first.num_in_flight = 2  # busier, but within the slack: the cached prefix wins
    assert router.route(system_prompt + [3, 4, 5]) is first
    assert router.route([5, 5, 5, 5, 1]) is other  # no shared prefix: least loaded
    first.num_in_flight = 3  # now more than 2 above the other replica
    assert router.route(system_prompt + [6]) is other


def test_generate_and_abort_reach_the_chosen_replica():
    replicas = [FakeReplica(), FakeReplica()]
    router = ReplicaRouter(replicas, prefix_aware=False)
    replicas[0].num_in_flight = 1

    async def run():
        outputs = router.generate("r1", [1, 2], params=None)
        assert await outputs.__anext__() == "r1"
        router.abort("r1")
        await outputs.aclose()

    asyncio.run(run())
    assert replicas[1].served == ["r1"] and replicas[1].aborted == ["r1"]
    assert replicas[0].served == [] and replicas[0].aborted == []


def test_observers_see_queue_and_cache_gauges_summed_over_replicas():
    replicas = [FakeReplica(), FakeReplica()]
    router = ReplicaRouter(replicas, prefix_aware=False)
    seen = []
    router.add_observer(seen.append)
    replicas[0].observers[0](StepStats(2, 1, 0.5, 50, 100, generation_tokens=3))
    replicas[1].observers[0](StepStats(1, 4, 0.25, 150, 200, generation_tokens=5))
    last = seen[-1]
    assert (last.num_running, last.num_waiting, last.num_free_blocks, last.num_total_blocks) == (
        3,
        5,
        200,
        300,
    )
    assert abs(last.kv_cache_usage - (1 - 200 / 300)) < 1e-12
    assert last.generation_tokens == 5  # counters are per step, not summed twice


def test_observers_see_prefix_cache_totals_summed_over_replicas():
    replicas = [FakeReplica(), FakeReplica()]
    router = ReplicaRouter(replicas, prefix_aware=True)
    seen = []
    router.add_observer(seen.append)
    replicas[0].observers[0](StepStats(0, 0, 0.0, 10, 10, prefix_cache=PrefixCacheStats(100, 64, 2, 1)))
    replicas[1].observers[0](StepStats(0, 0, 0.0, 10, 10, prefix_cache=PrefixCacheStats(60, 16, 3, 1)))
    replicas[0].observers[0](StepStats(0, 0, 0.0, 10, 10, prefix_cache=PrefixCacheStats(140, 96, 3, 2)))
    totals = seen[-1].prefix_cache  # replica 0's latest totals plus replica 1's
    assert (totals.queried_tokens, totals.hit_tokens, totals.queried_requests, totals.hit_requests) == (
        200,
        112,
        6,
        3,
    )
    assert totals.hit_token_rate == 112 / 200 and totals.hit_request_rate == 3 / 6


def test_observers_see_speculative_totals_summed_over_replicas():
    """With --speculative-config and --data-parallel-size 2, /metrics counts both replicas' drafts."""
    replicas = [FakeReplica(), FakeReplica()]
    router = ReplicaRouter(replicas, prefix_aware=True)
    seen = []
    router.add_observer(seen.append)
    replicas[0].observers[0](StepStats(0, 0, 0.0, 10, 10))
    assert seen[-1].spec_decode is None  # engines that do not speculate report none
    replicas[0].observers[0](StepStats(0, 0, 0.0, 10, 10, spec_decode=SpecDecodeStats(2, 8, 5, 7)))
    replicas[1].observers[0](StepStats(0, 0, 0.0, 10, 10, spec_decode=SpecDecodeStats(1, 4, 1, 2)))
    assert seen[-1].spec_decode == SpecDecodeStats(3, 12, 6, 9)
