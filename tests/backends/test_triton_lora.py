"""The SGMV kernel of LoRA's segmented products, interpreted, against float64 numpy; and the
cuda backend's LoRA ops on torch-cpu with the Triton kernels (the conformance check)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="Triton's interpreter needs torch (the test extra installs it)")
pytest.importorskip("triton", reason="the kernels are Triton kernels (the test extra installs triton)")
from fastdeploy.backends.capabilities import Capability  # noqa: E402
from fastdeploy.backends.conformance import CAPABILITY_CHECKS, build_backend  # noqa: E402
from fastdeploy.backends.cuda import triton_lora  # noqa: E402
from fastdeploy.backends.lora import segments_by_slot  # noqa: E402


def tensor(array):
    return torch.from_numpy(np.ascontiguousarray(array))


@pytest.mark.parametrize("width_out", [24, 200])
def test_shrink_then_expand_adds_each_rows_adapter(width_out):
    rng = np.random.default_rng(width_out)
    slots, width_in, rank = 3, 40, 12
    token_slots = np.array([1, -1, 0, 1, 1, 2, -1, 0] + [2] * 19, np.int64)  # a segment over one row tile
    x = rng.standard_normal((token_slots.size, width_in)).astype(np.float32)
    y = rng.standard_normal((token_slots.size, width_out)).astype(np.float32)
    a = rng.standard_normal((slots, width_in, rank)).astype(np.float32)
    b = rng.standard_normal((slots, rank, width_out)).astype(np.float32)
    grouped = segments_by_slot(token_slots)
    order = (
        grouped.rows
        if isinstance(grouped.rows, np.ndarray)
        else np.arange(grouped.rows.start, grouped.rows.stop)
    )
    starts = np.array([start for _, start, _ in grouped.segments] + [grouped.count], np.int64)
    seg_slots = np.array([slot for slot, _, _ in grouped.segments], np.int64)
    longest = max(end - start for _, start, end in grouped.segments)
    shrunk = np.zeros((grouped.count, rank), np.float32)
    out = y.copy()
    args = (tensor(order.astype(np.int64)),)
    triton_lora.sgmv(
        tensor(x), *args, tensor(a), tensor(shrunk), tensor(starts), tensor(seg_slots), longest, True
    )
    triton_lora.sgmv(
        tensor(shrunk), *args, tensor(b), tensor(out), tensor(starts), tensor(seg_slots), longest, False
    )
    expected = y.astype(np.float64)
    for row, slot in enumerate(token_slots.tolist()):
        if slot >= 0:
            expected[row] += (x[row].astype(np.float64) @ a[slot]) @ b[slot]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_backend_lora_ops_on_torch_cpu_with_triton(monkeypatch):
    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    backend = build_backend("torch-cpu", threads=1)
    assert backend.launch is not None
    assert CAPABILITY_CHECKS[Capability.LORA](backend) is None
