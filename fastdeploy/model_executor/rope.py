"""Rotary-embedding frequency tables, including the `rope_scaling` variants Llama checkpoints use.

Computed once on the host when a model is built; backends receive plain cos/sin tables of shape
[max_positions, rotary_dim / 2]. Variants follow the definitions in the Llama 3, YaRN, LongRoPE and
position-interpolation papers (the same ones transformers implements).

Backends rotate in the rotate-half (NeoX / Hugging Face Llama) layout. Checkpoints whose q/k rows
pair adjacent dimensions instead (ERNIE-4.5, GPT-J-style models, llama.cpp's GGUF permutation of
Llama) are brought to that layout once at load time with `interleaved_to_half_rows`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.weight_only import WeightOnlyTensor


def _default_inv_freq(base: float, rotary_dim: int) -> np.ndarray:
    exponents = np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim
    return 1.0 / (base**exponents)


def _required(scaling: dict[str, Any], name: str, kind: str) -> Any:
    value = scaling.get(name)
    if value is None:
        raise InvalidArgumentError(f"rope_scaling of type {kind!r} lacks the required field {name!r}")
    return value


def _llama3(inv_freq: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    factor = float(_required(scaling, "factor", "llama3"))
    low_factor = float(scaling.get("low_freq_factor", 1.0))
    high_factor = float(scaling.get("high_freq_factor", 4.0))
    original = float(_required(scaling, "original_max_position_embeddings", "llama3"))
    wavelength = 2 * math.pi / inv_freq
    scaled = np.where(wavelength > original / low_factor, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low_factor) / (high_factor - low_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= original / high_factor) & (wavelength <= original / low_factor)
    return np.where(medium, blended, scaled)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _yarn(
    base: float, rotary_dim: int, scaling: dict[str, Any], max_positions: int
) -> tuple[np.ndarray, float]:
    factor = float(_required(scaling, "factor", "yarn"))
    original = float(scaling.get("original_max_position_embeddings") or max_positions)
    beta_fast = float(scaling.get("beta_fast") or 32.0)
    beta_slow = float(scaling.get("beta_slow") or 1.0)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        # DeepSeek-style checkpoints give mscale / mscale_all_dim; their ratio is the factor
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, float(mscale)) / _yarn_mscale(
                factor, float(mscale_all_dim)
            )
        else:
            attention_factor = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation = _default_inv_freq(base, rotary_dim)
    interpolation = extrapolation / factor
    keep_extrapolated = 1.0 - ramp
    inv_freq = interpolation * (1 - keep_extrapolated) + extrapolation * keep_extrapolated
    return inv_freq, float(attention_factor)


def _longrope(
    base: float, rotary_dim: int, scaling: dict[str, Any], max_positions: int
) -> tuple[np.ndarray, float]:
    """Phi-3's LongRoPE: per-frequency divisors, `long_factor` when the engine's context exceeds
    the pretraining one (`original_max_position_embeddings`), `short_factor` otherwise, as
    llama.cpp chooses by context size. The attention factor follows from `factor` (the context
    extension ratio, max_position_embeddings / original_max_position_embeddings)."""
    original = int(_required(scaling, "original_max_position_embeddings", "longrope"))
    key = "long_factor" if max_positions > original else "short_factor"
    factors = np.asarray(_required(scaling, key, "longrope"), dtype=np.float64)
    if factors.shape != (rotary_dim // 2,):
        raise InvalidArgumentError(
            f"rope_scaling {key} has {factors.size} entries, the rotary dimension {rotary_dim} needs "
            f"{rotary_dim // 2}"
        )
    factor = float(_required(scaling, "factor", "longrope"))
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
    return _default_inv_freq(base, rotary_dim) / factors, float(attention_factor)


def inverse_frequencies(
    base: float, rotary_dim: int, scaling: dict[str, Any] | None, max_positions: int
) -> tuple[np.ndarray, float]:
    """(inverse frequencies [rotary_dim/2], multiplier for cos/sin) for a `rope_scaling` dict."""
    if not scaling:
        return _default_inv_freq(base, rotary_dim), 1.0
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return _default_inv_freq(base, rotary_dim), 1.0
    if kind == "linear":
        return _default_inv_freq(base, rotary_dim) / float(scaling["factor"]), 1.0
    if kind == "dynamic":
        # Static NTK: frequencies for the longest context the engine will see.
        factor = float(scaling["factor"])
        scaled_base = base * (factor * factor - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
        return _default_inv_freq(scaled_base, rotary_dim), 1.0
    if kind == "llama3":
        return _llama3(_default_inv_freq(base, rotary_dim), scaling), 1.0
    if kind == "yarn":
        return _yarn(base, rotary_dim, scaling, max_positions)
    if kind in ("longrope", "su"):
        return _longrope(base, rotary_dim, scaling, max_positions)
    raise InvalidArgumentError(
        f"rope_scaling type {kind!r} is not supported "
        "(supported: default, linear, dynamic, llama3, yarn, longrope)"
    )


def rope_tables(
    base: float,
    rotary_dim: int,
    max_positions: int,
    scaling: dict[str, Any] | None = None,
    freq_factors: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """float32 (cos, sin) tables [max_positions, rotary_dim/2].

    `freq_factors` (GGUF's `rope_freqs` tensor) divides the frequencies, as llama.cpp does.
    """
    inv_freq, multiplier = inverse_frequencies(base, rotary_dim, scaling, max_positions)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)
    angles = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq)
    return (np.cos(angles) * multiplier).astype(np.float32), (np.sin(angles) * multiplier).astype(np.float32)


def interleaved_to_half_rows(rows: Any, num_heads: int) -> Any:
    """A q/k projection weight [heads * head_dim, in] (or bias [heads * head_dim]) with each head's
    rows reordered from adjacent pairs (2i, 2i+1) to halves (i, i + head_dim/2).

    q.k is unchanged when every query and key head is permuted the same way, so after this the
    backend's rotate-half `rotary_embedding` computes what interleaved rotary would. GGUF blocks
    run along the input axis, so a `GGMLTensor` moves whole rows without dequantising.
    """
    count = rows.shape[0]
    half = count // num_heads // 2
    order = np.arange(count).reshape(num_heads, half, 2).swapaxes(1, 2).reshape(count)
    return rows.take_rows(order) if isinstance(rows, (GGMLTensor, WeightOnlyTensor)) else rows[order]
