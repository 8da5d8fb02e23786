"""Rotary frequencies against transformers' values (tests/fixtures/rope_reference.json)."""

import json
import os

import numpy as np
import pytest

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.model_executor.rope import interleaved_to_half_rows, inverse_frequencies, rope_tables

with open(
    os.path.join(os.path.dirname(__file__), "..", "fixtures", "rope_reference.json"), encoding="utf-8"
) as f:
    REFERENCE = json.load(f)["cases"]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_scaled_frequencies_match_transformers(name):
    case = REFERENCE[name]
    inv_freq, factor = inverse_frequencies(
        case["rope_theta"], case["head_dim"], case["rope_scaling"], case["engine_max_positions"]
    )
    np.testing.assert_allclose(inv_freq, case["inv_freq"], rtol=1e-6)
    assert factor == pytest.approx(case["attention_factor"], rel=1e-9)


def test_default_tables_are_cos_and_sin_of_position_times_frequency():
    cos, sin = rope_tables(10000.0, 4, 3)
    inv = np.array([1.0, 0.01])
    np.testing.assert_allclose(cos, np.cos(np.outer(np.arange(3), inv)), rtol=1e-6)
    np.testing.assert_allclose(sin, np.sin(np.outer(np.arange(3), inv)), rtol=1e-6, atol=1e-7)


def test_freq_factors_divide_the_frequencies():
    plain, _ = inverse_frequencies(10000.0, 4, None, 16)
    _, sin = rope_tables(10000.0, 4, 2, freq_factors=np.array([1.0, 4.0]))
    np.testing.assert_allclose(sin[1], np.sin(plain / [1.0, 4.0]), rtol=1e-6)


def test_unknown_scaling_type_is_named():
    with pytest.raises(InvalidArgumentError, match="rope_scaling type 'mystery'"):
        inverse_frequencies(10000.0, 8, {"rope_type": "mystery", "factor": 2}, 16)


def test_interleaved_to_half_rows_order_per_head():
    """Two heads of head_dim 4: pairs (0,1),(2,3) become halves (0,2 | 1,3) within each head."""
    rows = np.arange(8)
    np.testing.assert_array_equal(interleaved_to_half_rows(rows, num_heads=2), [0, 2, 1, 3, 4, 6, 5, 7])


def _interleaved_rotary(x: np.ndarray, position: int, inv_freq: np.ndarray) -> np.ndarray:
    """GPT-J-style rotary: dimension pairs (2i, 2i+1) rotate by position * inv_freq[i]."""
    out = x.astype(np.float64).copy()
    for i, freq in enumerate(inv_freq):
        c, s = np.cos(position * freq), np.sin(position * freq)
        a, b = x[2 * i], x[2 * i + 1]
        out[2 * i], out[2 * i + 1] = a * c - b * s, b * c + a * s
    return out


def test_permuted_projections_with_rotate_half_give_interleaved_attention_scores():
    """q.k of interleaved rotary on the original rows equals rotate-half rotary on permuted rows."""
    rng = np.random.default_rng(3)
    head_dim, hidden = 8, 5
    wq, wk, x_q, x_k = (
        rng.standard_normal((head_dim, hidden)),
        rng.standard_normal((head_dim, hidden)),
        *rng.standard_normal((2, hidden)),
    )
    cos, sin = rope_tables(10000.0, head_dim, 16)
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, head_dim, 2) / head_dim)
    expected = _interleaved_rotary(wq @ x_q, 11, inv_freq) @ _interleaved_rotary(wk @ x_k, 3, inv_freq)

    def rotate_half(v: np.ndarray, position: int) -> np.ndarray:
        a, b = v[: head_dim // 2], v[head_dim // 2 :]
        return np.concatenate([a * cos[position] - b * sin[position], b * cos[position] + a * sin[position]])

    q = rotate_half(interleaved_to_half_rows(wq, 1) @ x_q, 11)
    k = rotate_half(interleaved_to_half_rows(wk, 1) @ x_k, 3)
    assert q @ k == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    ("scaling", "field"),
    [
        (
            {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 4, "factor": 2.0},
            "original",
        ),
        ({"rope_type": "llama3", "original_max_position_embeddings": 64}, "factor"),
        ({"rope_type": "yarn", "original_max_position_embeddings": 64}, "factor"),
    ],
)
def test_a_missing_scaling_field_is_named(scaling, field):
    with pytest.raises(InvalidArgumentError, match=f"lacks the required field '{field}"):
        inverse_frequencies(10000.0, 8, scaling, 128)
