"""The cpu backend keeps freed arrays mapped (host_memory.py): a repeated pass faults in no new pages."""

from __future__ import annotations

import platform
import resource

import numpy as np
import pytest

from fastdeploy.backends.cpu.host_memory import retain_freed_memory

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def _page_faults_of_a_pass() -> int:
    """Minor page faults while four 6 MiB arrays (6,144 pages in all) are written and freed: the
    shape of an encoder layer's activations, large enough that glibc would unmap or trim them."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arrays = [np.ones(6 << 20, np.uint8) for _ in range(4)]
    del arrays
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_a_second_pass_reuses_the_first_pass_pages():
    assert retain_freed_memory()
    _page_faults_of_a_pass()  # the heap grows to the pass's size once
    assert _page_faults_of_a_pass() < 100  # without the thresholds: ~2,000 every pass (glibc 2.36)


def test_the_cpu_backend_sets_the_thresholds(monkeypatch):
    from fastdeploy.backends.base import BackendOptions
    from fastdeploy.backends.cpu import backend as cpu_backend

    calls = []
    monkeypatch.setattr(cpu_backend, "retain_freed_memory", lambda: calls.append(True))
    cpu_backend.CpuBackend(BackendOptions())
    assert calls == [True]
