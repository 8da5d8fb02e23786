"""The cuda backend's token mask (guided decoding) runs on the device: only the packed bits cross
from the host, the logits never come back, and half-precision logits keep their exact values.

Checked on the host twins of both runtimes (torch-cpu, paddle-cpu); the conformance suite's
`token_bitmask` check covers float32 on every device, with and without the Triton kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.backends.conformance import build_backend

RUNTIMES = {"torch-cpu": "torch", "paddle-cpu": "paddle"}


def _bitmask(allowed: list[list[int]], vocab: int) -> np.ndarray:
    """Hand-packed int32 bitmask: token t is bit t % 32 of word t // 32."""
    words = np.zeros((len(allowed), -(-vocab // 32)), dtype=np.uint32)
    for i, tokens in enumerate(allowed):
        for token in tokens:
            words[i, token // 32] |= np.uint32(1 << (token % 32))
    return words.view(np.int32)


@pytest.fixture(scope="module", params=sorted(RUNTIMES))
def backend(request):
    pytest.importorskip(RUNTIMES[request.param], reason=f"{request.param} needs {RUNTIMES[request.param]}")
    return build_backend(request.param, threads=1)


def test_logits_never_go_to_the_host(backend, monkeypatch):
    vocab = 100
    logits = np.arange(4 * vocab, dtype=np.float32).reshape(4, vocab)
    device_logits = backend.from_numpy(logits)

    def no_host_copy(tensor):
        raise AssertionError("apply_token_bitmask copied a tensor to the host")

    monkeypatch.setattr(backend.rt, "to_numpy", no_host_copy)
    out = backend.apply_token_bitmask(
        device_logits, _bitmask([[7, 99], [0]], vocab), np.array([2, 0], dtype=np.int64)
    )
    monkeypatch.undo()
    host = backend.to_numpy(out)
    assert list(np.flatnonzero(np.isfinite(host[2]))) == [7, 99]
    assert list(np.flatnonzero(np.isfinite(host[0]))) == [0]
    np.testing.assert_array_equal(host[[1, 3]], logits[[1, 3]])
    assert host[2, 99] == logits[2, 99] and host[0, 0] == logits[0, 0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_logits_keep_their_values(backend, dtype):
    if backend.rt.name == "paddle":
        pytest.skip("Paddle's CPU build has no half-precision kernels (paddle-cpu is float32 only)")
    rng = np.random.default_rng(4)
    vocab = 33  # one full word and one bit of the next
    logits = backend.rt.cast(backend.from_numpy(rng.standard_normal((3, vocab)).astype(np.float32)), dtype)
    before = backend.to_numpy(logits).copy()  # float32 copies of the half values: exact
    allowed = [[0, 31, 32], list(range(vocab)), []]
    out = backend.apply_token_bitmask(logits, _bitmask(allowed, vocab), np.array([0, 1, 2], dtype=np.int64))
    assert backend.rt.dtype_name(out) == dtype
    expected = np.full_like(before, -np.inf)
    for row, tokens in enumerate(allowed):
        expected[row, tokens] = before[row, tokens]
    np.testing.assert_array_equal(backend.to_numpy(out), expected)
