"""The cpu backend's packed weights live in `WeightArena` slices: page-aligned, disjoint, and on
mappings the kernel may back with transparent huge pages."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_native_kernels import ggml_matrix, requires_native

from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.backends.cpu.native import weight_arena
from fastdeploy.backends.cpu.native.weight_arena import WeightArena


def test_slices_are_aligned_disjoint_and_survive_the_arena(monkeypatch):
    monkeypatch.setattr(weight_arena, "CHUNK", 1 << 20)  # several chunks, one slice larger than a chunk
    arena = WeightArena()
    sizes = [100, 4096, 300_000, 5 << 20, 7, 600_000]
    slices = [arena.empty(size) for size in sizes]
    del arena
    for index, (size, piece) in enumerate(zip(sizes, slices, strict=True)):
        assert piece.size == size and piece.dtype == np.uint8
        assert piece.ctypes.data % weight_arena.ALIGN == 0
        piece[:] = index
    spans = sorted((piece.ctypes.data, piece.ctypes.data + piece.size) for piece in slices)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))
    assert [int(piece[-1]) for piece in slices] == list(range(len(sizes)))


def _transparent_huge_pages() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as handle:
            return re.search(r"\[(\w+)\]", handle.read()).group(1)
    except (OSError, AttributeError):
        return "unavailable"


def _huge_page_eligible(address: int) -> bool:
    """Whether /proc/self/smaps says the mapping holding `address` may use huge pages."""
    with open("/proc/self/smaps", encoding="ascii") as handle:
        inside = False
        for line in handle:
            span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if span:
                inside = int(span.group(1), 16) <= address < int(span.group(2), 16)
            elif inside and line.startswith("THPeligible:"):
                return line.split()[1] == "1"
    raise AssertionError(f"no mapping holds {address:#x}")


@requires_native
@pytest.mark.skipif(
    _transparent_huge_pages() not in ("always", "madvise"),
    reason=f"transparent huge pages are {_transparent_huge_pages()} here",
)
def test_the_backend_packs_weights_onto_huge_page_mappings():
    backend = CpuBackend(BackendOptions(threads=1))
    for part in (ggml_matrix("Q4_1", 64, 128), np.ones((40, 50), np.float32)):
        weight = backend.linear_weight(part)
        assert isinstance(weight, native.PackedWeight)
        assert _huge_page_eligible(weight.packed.ctypes.data)
    assert backend.weight_arena.advised
