"""The cuda backend's Triton kernels under Triton's interpreter, against numpy references.

TRITON_INTERPRET=1 is set by tests/backends/conftest.py before the kernels are imported; the
interpreter runs them on torch CPU tensors, shared zero-copy with the numpy arrays compared.
A separate test compiles them for real GPUs (sm_80, sm_90) without a GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from fastdeploy.backends.conformance import numpy_reference as ref

torch = pytest.importorskip("torch", reason="Triton's interpreter needs torch (the test extra installs it)")
pytest.importorskip("triton", reason="the kernels are Triton kernels (the test extra installs triton)")
from fastdeploy.backends.cuda import triton_kernels as kernels  # noqa: E402
from fastdeploy.backends.cuda.aot import SHARED_MEMORY_LIMIT  # noqa: E402
from fastdeploy.backends.cuda.triton_attention import prefill_launch_options  # noqa: E402
from fastdeploy.backends.cuda.triton_moe import gemm_config  # noqa: E402


def tensor(array: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(array))


def test_kernels_are_interpreted():
    """Guards the conftest: compiled kernels would need a GPU and fail differently."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert type(kernels._rms_norm_kernel).__name__ == "InterpretedFunction"


@pytest.mark.parametrize("hidden", [48, 576])
def test_fused_add_rms_norm(hidden):
    rng = np.random.default_rng(hidden)
    x, residual = rng.standard_normal((2, 5, hidden)).astype(np.float32)
    weight = rng.standard_normal(hidden).astype(np.float32)
    out, new_residual = np.empty_like(x), np.empty_like(x)
    kernels.rms_norm(tensor(x), tensor(weight), 1e-6, tensor(residual), tensor(out), tensor(new_residual))
    total = x.astype(np.float64) + residual
    np.testing.assert_allclose(new_residual, total, rtol=1e-6)
    np.testing.assert_allclose(out, ref.rms_norm(total, weight, 1e-6), rtol=1e-5, atol=1e-6)
    plain = np.empty_like(x)
    kernels.rms_norm(tensor(x), tensor(weight), 1e-6, None, tensor(plain), None)
    np.testing.assert_allclose(plain, ref.rms_norm(x, weight, 1e-6), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(64, 64), (24, 16)])
@pytest.mark.parametrize("heads", [3, 9])
def test_rotary_reads_heads_in_place_from_a_wider_row(head_dim, rotary_dim, heads):
    """x is the middle of each row of a fused projection (q or k of qkv), read without a copy."""
    rng = np.random.default_rng(head_dim)
    width = heads * head_dim
    rows = rng.standard_normal((5, width + 2 * head_dim + 3)).astype(np.float32)
    x = rows[:, head_dim : head_dim + width].reshape(5, heads, head_dim)
    strided = tensor(rows)[:, head_dim : head_dim + width].reshape(5, heads, head_dim)
    assert strided.stride(0) == rows.shape[1]  # a view, not a copy
    positions = np.array([0, 9, 3, 31, 4], dtype=np.int64)
    inv_freq = 1.0 / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = np.outer(np.arange(32), inv_freq)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    out = np.full((5, heads, head_dim), np.nan, np.float32)
    kernels.rotary_embedding(
        strided, tensor(positions), tensor(cos), tensor(sin), tensor(out), strided.stride(0)
    )
    np.testing.assert_allclose(out, ref.rotary(x, positions, inv_freq), rtol=1e-5, atol=1e-5)


def test_store_kv_writes_only_the_given_slots():
    rng = np.random.default_rng(3)
    keys, values = rng.standard_normal((2, 4, 2, 8)).astype(np.float32)
    key_cache, value_cache = np.zeros((2, 12, 2, 8), np.float32)
    slots = np.array([11, 0, 5, 6], dtype=np.int64)
    kernels.store_kv(tensor(keys), tensor(values), tensor(key_cache), tensor(value_cache), tensor(slots))
    expected_keys, expected_values = np.zeros((2, 12, 2, 8), np.float32)
    expected_keys[slots], expected_values[slots] = keys, values
    np.testing.assert_array_equal(key_cache, expected_keys)
    np.testing.assert_array_equal(value_cache, expected_values)


def test_store_kv_reads_values_in_place_from_a_wider_row():
    rng = np.random.default_rng(4)
    keys = rng.standard_normal((3, 2, 8)).astype(np.float32)
    rows = rng.standard_normal((3, 40)).astype(np.float32)  # [q | k | v] of a fused projection
    values = tensor(rows)[:, 24:40].reshape(3, 2, 8)
    key_cache, value_cache = np.zeros((2, 6, 2, 8), np.float32)
    slots = np.array([4, 1, 2], dtype=np.int64)
    kernels.store_kv(
        tensor(keys), values, tensor(key_cache), tensor(value_cache), tensor(slots), values.stride(0)
    )
    np.testing.assert_array_equal(key_cache[slots], keys)
    np.testing.assert_array_equal(value_cache[slots], rows[:, 24:40].reshape(3, 2, 8))


def test_store_kv_skips_negative_slots():
    """Padding rows of a CUDA-graph batch carry slot -1 and must not write anywhere."""
    keys = np.ones((2, 1, 4), np.float32)
    key_cache, value_cache = np.zeros((2, 3, 1, 4), np.float32)
    kernels.store_kv(
        tensor(keys), tensor(keys), tensor(key_cache), tensor(value_cache), tensor(np.array([2, -1]))
    )
    assert key_cache[2].sum() == 4 and key_cache[:2].sum() == 0 and value_cache[2].sum() == 4


@pytest.mark.parametrize("width", [7, 48])
def test_silu_and_mul(width):
    rng = np.random.default_rng(width)
    x = rng.standard_normal((3, 2 * width)).astype(np.float32)
    out = np.zeros((3, width), np.float32)
    kernels.silu_and_mul(tensor(x), tensor(out))
    np.testing.assert_allclose(out, ref.silu_and_mul(x), rtol=1e-5, atol=1e-6)


def _float32_launches(shared_memory: int) -> list[dict[str, int]]:
    """The float32 tiles and launch options of the kernels whose tiles may follow the GPU."""
    prefill = [prefill_launch_options(True, head_dim, shared_memory) for head_dim in (64, 128, 192)]
    return prefill + [gemm_config(entries, 64, True, shared_memory) for entries in (96, 1536, 24576)]


def _compile(arch: str, dtypes: str) -> list[str]:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "fastdeploy.backends.cuda.aot", arch, "--dtypes", dtypes]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def test_kernels_compile_for_sm80_and_sm90_without_a_gpu():
    """Triton lowers each kernel to PTX and a cubin for real GPUs, at the shapes the backend
    launches; shape or dtype errors the interpreter lets through (tl.dot needs 16 rows and matching
    operand dtypes) fail here. bfloat16 on sm_80 and sm_90 (tensor-core mma on one, wgmma on the
    other; tiles that follow the shared memory); float32 on sm_80 only: its tiles and launch
    options are the same on both (checked first) and its ieee dots take no tensor cores, so sm_90
    would compile the same code against a larger shared-memory limit, at over a quarter of the
    check's time. float16 is left to the command line's default (all three dtypes): it takes the
    bfloat16 code paths and tiles (same element size)."""
    assert _float32_launches(SHARED_MEMORY_LIMIT[80]) == _float32_launches(SHARED_MEMORY_LIMIT[90])
    lines = _compile("80", "float32,bfloat16") + _compile("90", "bfloat16")
    # element-wise, prefill x 4 (one windowed with sinks, one windowed and soft-capped), decode x 6
    # (two with sinks, one soft-capped), reduce x 2 (with and without sinks), latent attention
    # (store, absorbed decode x 2, its reduce, prefill over 192-wide expanded keys), route, MoE GEMMs
    per_dtype = 4 + 4 + 6 + 2 + 5 + 1 + 4
    dtype_free = 6  # sampling (4) and MoE sort (2) kernels, float32 only, on each architecture
    assert len(lines) == 3 * per_dtype + 2 * dtype_free
    sm90 = [line.split()[1:3] for line in lines if line.startswith("sm_90")]
    assert len(sm90) == per_dtype + dtype_free
    assert sum(dtype == "float32" for dtype, _ in sm90) == dtype_free  # the sampling and sort kernels
    names = {line.split()[2] for line in lines}
    assert {"_prefill_kernel", "_decode_kernel", "_pick_kernel", "_gemm_kernel", "_route_kernel"} <= names
    assert {"_store_latent_kernel", "_latent_decode_kernel", "_latent_reduce_kernel"} <= names
    sizes = [re.search(r"ptx +(\d+) B, cubin +(\d+) B", line) for line in lines]
    assert all(found and int(found[1]) > 0 and int(found[2]) > 0 for found in sizes), lines
