"""The native kernels' thread pool (threadpool.c): results never depend on how the work was split,
which thread ran it, how threads wait, or whether the process forked.

Every output element of a kernel is computed by one task with one summation order, so any thread
count, a busy pool (a second caller runs its loop inline) and sleeping instead of spinning must all
give bit-identical results.
"""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quantize

from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.ggml_tensor import GGMLTensor

pytestmark = pytest.mark.skipif(
    native.unavailable_reason() is not None, reason=f"native kernels: {native.unavailable_reason()}"
)


def packed_q4_1(rows: int, cols: int) -> native.PackedWeight:
    weights = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    qtype = GGMLQuantizationType.Q4_1
    return native.pack([GGMLTensor(int(qtype), quantize(weights, qtype), (rows, cols))])


@pytest.fixture
def spin_us():
    """Restores the process-wide spin time after a test changes it."""
    yield native.set_spin_us
    native.set_spin_us(100)


WEIGHT = packed_q4_1(1000, 256)  # 32 tasks of two panels each
X = np.random.default_rng(1).standard_normal((7, 256)).astype(np.float32)


def one_thread_result() -> np.ndarray:
    return native.matmul(X, WEIGHT, native.best_isa(), threads=1)


@pytest.mark.parametrize("threads", [2, 3, 8, 64])
def test_any_thread_count_gives_the_one_thread_result(threads):
    """More threads than cores and than tasks included (64 threads, 32 tasks)."""
    np.testing.assert_array_equal(native.matmul(X, WEIGHT, native.best_isa(), threads), one_thread_result())


def test_callers_on_several_python_threads_at_once():
    """The kernels release the GIL: while one caller's loop runs on the pool, the others run theirs
    inline. All must finish with the right numbers."""
    expected = one_thread_result()
    results: list[np.ndarray] = []

    def call() -> None:
        for _ in range(50):
            results.append(native.matmul(X, WEIGHT, native.best_isa(), threads=2))

    callers = [threading.Thread(target=call) for _ in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=120)
    assert not any(caller.is_alive() for caller in callers)
    assert len(results) == 200
    for result in results:
        np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("microseconds", [0, 1, 100_000])
def test_sleeping_or_spinning_waiters_give_the_same_result(spin_us, microseconds):
    """0: every idle thread sleeps at once (futex wake-ups on each loop); 100 ms: they never sleep."""
    spin_us(microseconds)
    expected = one_thread_result()
    for _ in range(200):
        np.testing.assert_array_equal(native.matmul(X, WEIGHT, native.best_isa(), threads=2), expected)


def test_the_caller_returns_only_when_every_task_is_done():
    """Two long tasks (two panel pairs, a deep product): the caller runs one while a worker runs the
    other, and the output must be complete the moment the call returns."""
    weight = packed_q4_1(64, 32 * 1024)
    x = np.random.default_rng(2).standard_normal((16, 32 * 1024)).astype(np.float32)
    expected = native.matmul(x, weight, native.best_isa(), threads=1)
    for i in range(20):
        scale = np.float32(2.0 ** (i % 2 * 2 - 1))  # exact: each call's output differs from the last
        out = native.matmul(x * scale, weight, native.best_isa(), threads=2)
        np.testing.assert_array_equal(out, expected * scale)


def _matmul_in_child(queue) -> None:
    queue.put(native.matmul(X, WEIGHT, native.best_isa(), threads=2))


def test_a_forked_child_runs_the_kernels():
    """The parent's workers do not exist in a fork()ed child: its loops must neither wait for them
    nor hang."""
    native.matmul(X, WEIGHT, native.best_isa(), threads=2)  # the parent's pool is running
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_matmul_in_child, args=(queue,))
    child.start()
    result = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    np.testing.assert_array_equal(result, one_thread_result())


def test_spin_time_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    monkeypatch.setenv("FD_CPU_SPIN_US", "0")
    backend = CpuBackend(BackendOptions(threads=2))
    assert native._native.spin_us() == 0
    assert "sleep at once" in backend.describe()
    monkeypatch.setenv("FD_CPU_SPIN_US", "250")
    assert "spin 250 us, then sleep" in CpuBackend.runtime_details()
    CpuBackend(BackendOptions(threads=2))
    assert native._native.spin_us() == 250
    monkeypatch.delenv("FD_CPU_SPIN_US")
    CpuBackend(BackendOptions(threads=2))
    assert native._native.spin_us() == 100


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_a_bad_spin_time_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    monkeypatch.setenv("FD_CPU_SPIN_US", value)
    with pytest.raises(InvalidArgumentError, match="FD_CPU_SPIN_US must be a number of microseconds >= 0"):
        CpuBackend(BackendOptions(threads=2))
    assert "FD_CPU_SPIN_US must be" in CpuBackend.runtime_details()
