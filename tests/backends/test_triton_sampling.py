"""The sampling kernels (chunk maxima bound, candidate compaction, exact pick), interpreted,
against the float64 definition in numpy_reference.

Rows whose kept set is not inside the candidates come back as -1 (the backend samples them on
the host); every other row must equal the definition token for token.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.backends.conformance import numpy_reference as ref

torch = pytest.importorskip("torch", reason="Triton's interpreter needs torch (the test extra installs it)")
pytest.importorskip("triton", reason="the kernels are Triton kernels (the test extra installs triton)")
from fastdeploy.backends.cuda import triton_sampling as sampling  # noqa: E402

ROWS = 8
TOP_K = np.array([0, 1, 2, 10, 149, 150, 500, 3], dtype=np.int32)
TOP_P = np.array([1.0, 0.95, 0.7, 0.3, 0.05, 1.0, 0.5, 1.0], dtype=np.float32)
#: a small candidate buffer keeps the interpreted sorts quick (the GPU default is CAPACITY)
CANDIDATES = 64


def _run(logits, temperatures, uniforms, max_candidates=CANDIDATES):
    rows, vocab = logits.shape
    scratch = {
        name: torch.zeros(shape, dtype=getattr(torch, dtype))
        for name, (shape, dtype) in sampling.scratch_shapes(rows, vocab, max_candidates).items()
    }
    out = torch.full((rows,), -5, dtype=torch.int64)
    arrays = (logits, temperatures, TOP_K[:rows], TOP_P[:rows], uniforms)
    sampling.sample_top_k_top_p(*(torch.from_numpy(a) for a in arrays), out, scratch, max_candidates)
    return out.numpy(), scratch["count"].numpy()


def _inputs(seed, vocab=150):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((ROWS, vocab)) * 2.5).astype(np.float32)
    logits[3, 40:] = -np.inf  # banned tokens (the engine's bans are -inf logits)
    temperatures = rng.uniform(0.3, 1.5, ROWS).astype(np.float32)
    uniforms = rng.random(ROWS).astype(np.float32)
    expected = [
        ref.sample_top_k_top_p(logits[i], temperatures[i], TOP_K[i], TOP_P[i], uniforms[i])
        for i in range(ROWS)
    ]
    return logits, temperatures, uniforms, expected


def test_tokens_equal_the_definition_and_only_flat_nucleus_rows_fall_back():
    logits, temperatures, uniforms, expected = _inputs(7)
    out, _ = _run(logits, temperatures, uniforms)
    for row in range(ROWS):
        if out[row] != -1:
            assert out[row] == expected[row], row
    # top-k rows whose candidates hold >= k logits, and whole-row draws (top-k off, top-p 1), are exact
    for row in (0, 1, 2, 3, 5, 7):
        assert out[row] == expected[row], row
    assert out[3] < 40  # banned tokens are never drawn


def test_whole_row_draws_cover_every_uniform():
    """top-k off, top-p 1: inverse CDF over the whole row, through the group sums."""
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((ROWS, 150)).astype(np.float32)
    temperatures = np.ones(ROWS, np.float32)
    uniforms = np.linspace(0.0, 0.999, ROWS).astype(np.float32)
    uniforms[0] = 0.0
    saved = TOP_K.copy(), TOP_P.copy()
    TOP_K[:], TOP_P[:] = 0, 1.0
    try:
        out, _ = _run(logits, temperatures, uniforms)
    finally:
        TOP_K[:], TOP_P[:] = saved
    expected = [ref.sample_top_k_top_p(logits[i], 1.0, 0, 1.0, uniforms[i]) for i in range(ROWS)]
    assert out.tolist() == expected


def test_overflowing_candidates_are_flagged_not_guessed():
    logits, temperatures, uniforms, expected = _inputs(11)
    out, counts = _run(logits, temperatures, uniforms, max_candidates=16)
    overflowed = [
        row for row in range(ROWS) if counts[row] > 16 and not (TOP_K[row] == 0 and TOP_P[row] == 1)
    ]
    assert overflowed, "the test needs rows with more candidates than the buffer"
    for row in range(ROWS):
        if row in overflowed:
            assert out[row] == -1, row
        elif out[row] != -1:
            assert out[row] == expected[row], row


def test_chunk_width_scales_with_the_vocabulary():
    assert sampling.chunk_size(150) == 16 and sampling.chunk_size(152064) == 128
    assert sampling.capacity(150) == 256 and sampling.capacity(152064) == sampling.CAPACITY


def test_negative_logits_sample_like_any_others():
    """Candidates far below zero must still sort above the buffer's empty slots (a model whose
    logits are all negative samples from the same distribution as after any shift)."""
    logits, temperatures, uniforms, _ = _inputs(7)
    logits = logits - 60.0
    expected = [
        ref.sample_top_k_top_p(logits[i], temperatures[i], TOP_K[i], TOP_P[i], uniforms[i])
        for i in range(ROWS)
    ]
    out, _ = _run(logits, temperatures, uniforms)
    for row in (0, 1, 2, 3, 5, 7):
        assert out[row] == expected[row], row
