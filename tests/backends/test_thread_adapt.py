"""The default thread count follows the load (native/thread_adapt.c).

The policy is fed synthetic loop costs through `adapt_replay` (no clocks, no sleeping): each loop's
cost is given for every thread count, and the test checks which counts the policy ran them on. The
backend tests check who turns it on, and that results do not depend on it.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.errors import InvalidArgumentError

pytestmark = pytest.mark.skipif(
    native.unavailable_reason() is not None, reason=f"native kernels: {native.unavailable_reason()}"
)

#: a decode step's loops are of a few kinds with very different costs (a layer's products, its
#: attention); the pattern's period (7) does not divide the policy's window
KIND_WEIGHTS = np.array([1.0, 6.0, 1.0, 0.3, 6.0, 12.0, 0.5])


def replay(phases: list[tuple[int, list[float]]], noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """The thread counts picked for loops whose cost on t threads is `costs[t - 1]` microseconds times
    their kind's weight, phase after phase; `noise` multiplies the costs by factors of that standard
    deviation, one per run of 64 loops (other processes' load moves whole windows, measured +-20%)."""
    rng = np.random.default_rng(seed)
    kinds, costs = [], []
    for loops, per_thread in phases:
        index = np.arange(loops) % len(KIND_WEIGHTS)
        factors = np.repeat(1 + noise * rng.standard_normal((-(-loops // 64), len(per_thread))), 64, axis=0)[
            :loops
        ]
        costs.append(
            np.outer(KIND_WEIGHTS[index], np.array(per_thread) * 1000.0) * np.clip(factors, 0.2, None)
        )
        kinds.append(index + 1)
    return np.array(
        native._native.adapt_replay(np.concatenate(kinds).tolist(), np.concatenate(costs).tolist())
    )


QUIET = [100.0, 80.0]  # measured decode: 84 tok/s on one thread, 105 on two
ONE_HOG = [100.0, 135.0]  # beside one CPU hog: 83 on one thread, 62 on two


def test_a_quiet_machine_stays_on_every_thread():
    picked = replay([(20_000, QUIET)])
    assert picked[0] == 2
    assert set(picked) <= {1, 2}
    assert np.mean(picked[2_000:] == 2) > 0.97  # probes of one thread back off to 1 window in 65


def test_beside_a_hog_one_thread_takes_over():
    picked = replay([(20_000, ONE_HOG)])
    assert np.mean(picked[:2_000] == 1) > 0.5  # within a few windows of ~144 loops
    assert np.mean(picked[5_000:] == 1) > 0.97


def test_the_count_follows_the_load_as_it_comes_and_goes_despite_noise():
    phase = 30_000
    picked = replay([(phase, QUIET), (phase, ONE_HOG), (phase, QUIET)], noise=0.2)
    for number, best in enumerate((2, 1, 2)):
        settled = picked[number * phase + phase // 3 : (number + 1) * phase]
        assert np.mean(settled == best) > 0.9, (number, np.bincount(settled))


def test_a_hog_arriving_after_a_long_quiet_spell_is_noticed_within_a_few_windows():
    """Probes have backed off to one in 65 windows; the load change itself brings the next one
    forward (a 128-token decode is about 128 windows: waiting 65 would cost half of it)."""
    quiet = 40_000
    picked = replay([(quiet, QUIET), (20_000, ONE_HOG)])
    assert np.mean(picked[quiet : quiet + 2_000] == 1) > 0.5  # 2,000 loops: 14 windows


def test_noise_alone_does_not_make_it_leave_the_faster_count():
    """Windows' costs +-30%, two threads 25% faster: a probe that wins once by chance is probed again
    before it takes over (without that second probe: 92% of loops on two threads, here 96%)."""
    settled = [
        np.mean(replay([(40_000, [100.0, 75.0])], noise=0.3, seed=seed)[4_000:] == 2) for seed in range(4)
    ]
    assert np.mean(settled) > 0.94, settled


def test_more_threads_settle_on_the_fastest_count():
    """Four threads asked for, three fastest (the fourth core is busy): one step at a time to 3."""
    picked = replay([(30_000, [100.0, 60.0, 45.0, 70.0])])
    assert np.mean(picked[10_000:] == 3) > 0.95


def longest_run(picked: np.ndarray, threads: int) -> int:
    edges = np.diff(np.concatenate([[0], (picked == threads).astype(int), [0]]))
    return int(np.max(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1), initial=0))


def test_equal_costs_keep_the_count_asked_for():
    """Probes of one thread come and go (one window of 144 loops each), none takes over."""
    picked = replay([(20_000, [50.0, 50.0])])
    assert 0 < longest_run(picked, 1) <= 144
    assert np.mean(picked == 2) > 0.95


def test_a_probe_stops_at_loops_it_cannot_price():
    """Decode steps with a prefill now and then (kinds never seen: long loops, nothing to compare
    with): a probe that meets one returns to the incumbent within a few loops instead of running the
    rest of its window of the prefill on the slower count."""
    decode, prefill = 300, 150
    kinds, costs = [], []
    for burst in range(60):
        for i in range(decode):  # two threads faster
            weight = KIND_WEIGHTS[i % len(KIND_WEIGHTS)]
            kinds.append(i % len(KIND_WEIGHTS) + 1)
            costs.append([100e3 * weight, 60e3 * weight])
        kinds += range(1_000 + burst * prefill, 1_000 + (burst + 1) * prefill)  # 50x longer loops
        costs += [[5e6, 3e6]] * prefill
    picked = np.array(native._native.adapt_replay(kinds, costs)).reshape(60, decode + prefill)
    on_one_thread = (picked[:, decode:] == 1).sum(axis=1)
    assert on_one_thread.max() <= 16 + 8 + 1  # a probe's warm-up and unpriced loops at most
    assert on_one_thread.sum() < 0.02 * picked[:, decode:].size


def test_a_probe_in_long_loops_ends_after_its_time_not_its_loop_count():
    """Prefills of one shape again and again (loops of 1-36 ms whose costs are known): a probe of one
    thread runs about 100 ms of them, not the 144 loops (half a 512-token prefill) of a decode probe;
    and beside a hog the one thread still takes over."""
    prefill = [100.0 * 30, 53.0 * 30]  # two threads 1.9x as fast, each loop 30x a decode loop
    picked = replay([(8_000, prefill)])
    assert 0 < longest_run(picked, 1) <= 16  # 10 ms of warm-up and 100 ms: ~12 loops of 12 ms
    assert np.mean(picked == 2) > 0.98
    beside_a_hog = replay([(8_000, [100.0 * 30, 135.0 * 30])])
    assert np.mean(beside_a_hog[2_000:] == 1) > 0.95


def test_replay_checks_its_arguments():
    with pytest.raises(ValueError, match="one entry per loop"):
        native._native.adapt_replay([1, 2], [[1.0]])
    with pytest.raises(ValueError, match="a cost for 1.. threads"):
        native._native.adapt_replay([1], [[]])


@pytest.fixture
def restore_pool():
    yield
    native.set_adaptive_threads(False)


def test_the_default_thread_count_adapts_and_an_explicit_one_does_not(monkeypatch, restore_pool):
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    monkeypatch.delenv("FD_CPU_ADAPTIVE_THREADS", raising=False)
    backend = CpuBackend(BackendOptions())
    assert native._native.adaptive_state()["adaptive"] is True
    assert "thread count adapts to the load (FD_CPU_ADAPTIVE_THREADS)" in backend.describe()
    monkeypatch.delenv("FD_CPU_THREADS", raising=False)
    assert "thread count adapts" in CpuBackend.runtime_details()

    backend = CpuBackend(BackendOptions(threads=2))
    assert native._native.adaptive_state()["adaptive"] is False
    assert "fixed thread count" in backend.describe()
    monkeypatch.setenv("FD_CPU_THREADS", "2")
    assert "fixed thread count" in CpuBackend.runtime_details()


@pytest.mark.parametrize("value", ["0", "off", "false"])
def test_the_switch_turns_it_off(monkeypatch, restore_pool, value):
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    monkeypatch.delenv("FD_CPU_THREADS", raising=False)
    monkeypatch.setenv("FD_CPU_ADAPTIVE_THREADS", value)
    backend = CpuBackend(BackendOptions())
    assert native._native.adaptive_state()["adaptive"] is False
    assert "fixed thread count" in backend.describe()
    assert "fixed thread count" in CpuBackend.runtime_details()


def test_a_bad_switch_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    monkeypatch.setenv("FD_CPU_ADAPTIVE_THREADS", "maybe")
    with pytest.raises(InvalidArgumentError, match="FD_CPU_ADAPTIVE_THREADS must be 1 or 0"):
        CpuBackend(BackendOptions())
    assert "FD_CPU_ADAPTIVE_THREADS must be" in CpuBackend.runtime_details()


def test_adapting_loops_give_the_one_thread_result(restore_pool):
    """Thousands of loops: probes and switches happen (the machine's own timing decides which), and
    every result must be bit-identical to one thread's."""
    rng = np.random.default_rng(4)
    weight = native.pack([rng.standard_normal((512, 256)).astype(np.float32)])
    x = rng.standard_normal((3, 256)).astype(np.float32)
    expected = native.matmul(x, weight, native.best_isa(), threads=1)
    native.set_adaptive_threads(True)
    for _ in range(3_000):
        np.testing.assert_array_equal(native.matmul(x, weight, native.best_isa(), threads=2), expected)
    assert native._native.adaptive_state()["probes"] > 0
