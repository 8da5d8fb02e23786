"""`AsyncLLMEngine`'s thread logic on a scripted stand-in engine (no model): failures, capacity,
shutdown and the statistics it reports. The real engine is exercised by the server tests."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import aclosing
from types import SimpleNamespace

import pytest
from scripted_engine import ScriptedEngine

from fastdeploy.engine.async_engine import (
    AsyncLLMEngine,
    EngineOverloadedError,
    EngineStoppedError,
    GenerationError,
)
from fastdeploy.engine.request import RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.replicas import ReplicaRouter
from fastdeploy.errors import EngineDeadError, InvalidArgumentError


async def collect(
    engine: AsyncLLMEngine, request_id: str, max_tokens: int = 3, prompt=(1, 2)
) -> RequestOutput:
    last = None
    async with aclosing(
        engine.generate(request_id, list(prompt), SamplingParams(max_tokens=max_tokens))
    ) as outs:
        async for output in outs:
            last = output
    return last


@pytest.fixture
def scripted():
    fake = ScriptedEngine()
    engine = AsyncLLMEngine(fake, max_waiting=1)
    engine.start()
    yield fake, engine
    engine.shutdown()


def test_outputs_stream_and_finish(scripted):
    _, engine = scripted
    output = asyncio.run(collect(engine, "a", max_tokens=4))
    assert output.finished and output.outputs.token_ids == [0, 1, 2, 3]


def test_rejected_request_raises_in_the_caller(scripted):
    _, engine = scripted
    with pytest.raises(InvalidArgumentError, match="token ids"):
        asyncio.run(collect(engine, "bad", prompt=[-1]))


def test_failed_step_fails_its_requests_and_the_thread_goes_on(scripted):
    fake, engine = scripted
    fake.fail_next_step = True
    with pytest.raises(GenerationError, match="simulated step failure") as info:
        asyncio.run(collect(engine, "doomed"))
    assert info.value.code == 500 and "doomed" in fake.aborted
    assert asyncio.run(collect(engine, "after")).finished


def test_capacity_is_max_num_seqs_plus_max_waiting(scripted):
    fake, engine = scripted
    fake.gate = threading.Event()

    async def scenario():
        tasks = [asyncio.create_task(collect(engine, f"r{i}", max_tokens=2)) for i in range(5)]  # 4 + 1
        await asyncio.sleep(0)  # let every task register before the next request arrives
        assert engine.num_in_flight == 5
        with pytest.raises(EngineOverloadedError, match="--max-waiting"):
            await collect(engine, "one-too-many")
        fake.gate.set()
        return await asyncio.gather(*tasks)

    outputs = asyncio.run(scenario())
    assert all(output.finished for output in outputs) and engine.num_in_flight == 0


def test_more_requests_than_could_ever_fit_are_refused_even_when_idle(scripted):
    _, engine = scripted
    engine.check_capacity(5)  # 4 running + 1 waiting fit an idle engine
    with pytest.raises(InvalidArgumentError, match=r"6 prompts .* 4 running .* 1 waiting"):
        engine.check_capacity(6)


def test_shutdown_aborts_what_is_still_running():
    fake = ScriptedEngine()
    fake.gate = threading.Event()
    engine = AsyncLLMEngine(fake)
    engine.start()
    errors = []

    def consume():
        try:
            asyncio.run(collect(engine, "long", max_tokens=100))
        except EngineStoppedError as exc:
            errors.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    deadline = time.monotonic() + 30
    while "long" not in fake.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    stopper = threading.Thread(target=engine.shutdown)
    stopper.start()
    fake.gate.set()
    stopper.join(30)
    consumer.join(30)
    assert len(errors) == 1 and "long" in fake.aborted
    assert not engine.is_running
    with pytest.raises(EngineStoppedError):
        asyncio.run(collect(engine, "late"))


class BrokenBookkeeping(ScriptedEngine):
    """A bug outside step(): reading the scheduler fails."""

    @property
    def scheduler(self):
        raise ZeroDivisionError("simulated bug")


class DeadDevice(ScriptedEngine):
    def step(self):
        raise EngineDeadError("the probe pass failed too")


@pytest.mark.parametrize(
    ("stand_in", "message", "status", "cause"),
    [
        (BrokenBookkeeping, "engine stopped", 500, ZeroDivisionError),  # a bug in the thread
        (DeadDevice, "probe pass failed too", 503, EngineDeadError),  # the device is gone
    ],
)
def test_a_dying_engine_fails_requests_and_calls_the_fatal_callbacks(stand_in, message, status, cause):
    engine = AsyncLLMEngine(stand_in())
    reasons = []
    engine.on_fatal(reasons.append)
    engine.start()
    with pytest.raises(GenerationError, match=message) as info:
        asyncio.run(collect(engine, "x"))
    assert (info.value.code, info.value.kind) == (status, "engine_dead")
    assert not engine.is_running
    assert reasons == [engine.fatal_error] and isinstance(reasons[0], cause)
    with pytest.raises(EngineStoppedError, match="unavailable"):
        asyncio.run(collect(engine, "y"))
    engine.shutdown()


def test_fault_kinds_reach_the_caller():
    fake = ScriptedEngine()
    engine = AsyncLLMEngine(fake)
    original_step = fake.step

    def step_with_a_fault():
        outputs = original_step()
        for output in outputs:
            output.error_code, output.error_msg = 500, "the model produced NaN or infinite logits"
        fake.fault_isolation.faults_in_step = [SimpleNamespace(request_id="nan", kind="nonfinite_logits")]
        return outputs

    fake.step = step_with_a_fault
    engine.start()
    try:
        with pytest.raises(GenerationError, match="NaN") as info:
            asyncio.run(collect(engine, "nan"))
    finally:
        engine.shutdown()
    assert (info.value.code, info.value.kind) == (500, "nonfinite_logits")


def test_drain_refuses_new_requests_and_abort_all_ends_streams_with_abort(scripted):
    fake, engine = scripted
    fake.gate = threading.Event()

    async def scenario():
        running = asyncio.create_task(collect(engine, "running", max_tokens=100))
        await asyncio.sleep(0)
        engine.stop_accepting()
        assert not engine.is_accepting
        with pytest.raises(EngineStoppedError, match="shutting down"):
            await collect(engine, "late")
        engine.abort_all()
        fake.gate.set()
        return await running

    output = asyncio.run(scenario())
    assert output.finished and output.outputs.finish_reason == "abort"
    assert fake.aborted == ["running"]


def test_the_data_parallel_router_drains_every_replica():
    """The server drains a `--data-parallel-size` router like one engine: each replica refuses new
    requests, and the deadline's abort_all ends the streams on every replica with "abort"."""
    fakes = [ScriptedEngine(), ScriptedEngine()]
    replicas = [AsyncLLMEngine(fake) for fake in fakes]
    router = ReplicaRouter(replicas, prefix_aware=False)
    for fake in fakes:
        fake.gate = threading.Event()
    router.start()

    async def scenario():
        first = asyncio.create_task(collect(router, "first", max_tokens=100))
        await asyncio.sleep(0)
        second = asyncio.create_task(collect(router, "second", max_tokens=100))
        await asyncio.sleep(0)
        assert [replica.num_in_flight for replica in replicas] == [1, 1]
        router.stop_accepting()
        assert not router.is_accepting and all(not replica.is_accepting for replica in replicas)
        with pytest.raises(EngineStoppedError, match="shutting down"):
            await collect(router, "late")
        router.abort_all()
        for fake in fakes:
            fake.gate.set()
        return await first, await second

    try:
        outputs = asyncio.run(scenario())
    finally:
        router.shutdown()
    assert [output.outputs.finish_reason for output in outputs] == ["abort", "abort"]
    assert sorted(fake.aborted[0] for fake in fakes) == ["first", "second"]
    assert router.fatal_error is None


def test_observers_get_token_counts_and_latencies():
    fake = ScriptedEngine()
    engine = AsyncLLMEngine(fake)
    reports = []
    engine.add_observer(reports.append)
    engine.add_observer(lambda stats: 1 / 0)  # a failing observer must not disturb anything
    engine.start()
    try:
        asyncio.run(collect(engine, "m", max_tokens=3, prompt=[5, 6, 7, 8]))
    finally:
        engine.shutdown()
    assert sum(r.prompt_tokens for r in reports) == 4
    assert sum(r.generation_tokens for r in reports) == 3
    assert len([t for r in reports for t in r.first_token_latencies]) == 1
    assert len([t for r in reports for t in r.inter_token_latencies]) == 2
    assert [o.request_id for r in reports for o in r.finished] == ["m"]
    assert max(r.requests_in_step for r in reports) == 1
