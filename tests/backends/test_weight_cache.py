"""The on-disk cache of GGUF weights repacked for the cpu kernels (`FD_WEIGHT_CACHE`).

A file's blocks are repacked at its first start and read back at later ones; what comes back must
be what repacking gives, a replaced file must miss, and a cache that cannot be written must not
stop the engine.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from test_mixed_gguf_model import greedy, write_model
from test_native_kernels import requires_native

from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.model_executor.loaders.gguf_loader import GGUFLoader


@pytest.fixture
def model_path(tmp_path) -> str:
    path = tmp_path / "model" / "mixed.gguf"
    path.parent.mkdir()
    write_model(path)
    return str(path)


def entries(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.bin")) if directory.exists() else []


def packed(model_path: str, name: str) -> np.ndarray:
    """The packed bytes of one weight, packed by a fresh backend as the model loader packs it."""
    tensors = dict(GGUFLoader().load_tensors(model_path))
    weight = CpuBackend(BackendOptions(threads=1)).linear_weight(tensors[name])
    return np.array(weight.packed, copy=True)


@requires_native
def test_a_second_start_reads_what_the_first_repacked(model_path, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    monkeypatch.setenv("FD_WEIGHT_CACHE", "0")
    name = "model.layers.0.self_attn.o_proj.weight"
    repacked = packed(model_path, name)
    assert not entries(cache)
    monkeypatch.setenv("FD_WEIGHT_CACHE", str(cache))
    assert np.array_equal(packed(model_path, name), repacked)
    (entry,) = entries(cache)
    assert entry.stat().st_size == repacked.nbytes
    # the next start takes the entry as it is: a stored pattern comes back instead of a repack
    entry.write_bytes(bytes(range(256)) * (repacked.nbytes // 256) + bytes(repacked.nbytes % 256))
    assert np.array_equal(packed(model_path, name), np.fromfile(entry, np.uint8))


@requires_native
def test_a_replaced_file_misses(model_path, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    monkeypatch.setenv("FD_WEIGHT_CACHE", str(cache))
    name = "model.layers.1.mlp.down_proj.weight"
    first = packed(model_path, name)
    assert len(entries(cache)) == 1
    status = os.stat(model_path)
    os.utime(model_path, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))
    assert np.array_equal(packed(model_path, name), first)
    assert len(entries(cache)) == 2


@requires_native
def test_greedy_tokens_from_cached_weights_equal_the_float_reference(model_path, tmp_path, monkeypatch):
    """A whole model, started twice on one cache (the second start reads every weight and the
    embedding table from it), decodes as the numpy path on gguf's dequantised weights."""
    monkeypatch.setenv("FD_WEIGHT_CACHE", str(tmp_path / "cache"))
    reference = greedy(model_path, "numpy", monkeypatch)
    assert greedy(model_path, "auto", monkeypatch) == reference
    stored = entries(tmp_path / "cache")
    assert stored
    assert greedy(model_path, "auto", monkeypatch) == reference
    assert entries(tmp_path / "cache") == stored


@requires_native
def test_the_embedding_table_is_mapped_from_the_cache(model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    monkeypatch.setenv("FD_WEIGHT_CACHE", str(tmp_path / "cache"))
    table = dict(GGUFLoader().load_tensors(model_path))["model.embed_tokens.weight"]
    expected = dequantize(table.rows, GGMLQuantizationType(table.ggml_type)).reshape(table.shape)
    first = CpuBackend(BackendOptions(threads=1)).from_numpy(table)
    second = CpuBackend(BackendOptions(threads=1)).from_numpy(table)
    assert isinstance(second, np.memmap) and not isinstance(first, np.memmap)
    assert np.array_equal(first, expected) and np.array_equal(second, expected)


@requires_native
def test_a_cache_that_cannot_be_written_is_reported_and_skipped(model_path, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    monkeypatch.setenv("FD_WEIGHT_CACHE", "0")
    name = "model.layers.2.self_attn.o_proj.weight"
    repacked = packed(model_path, name)
    monkeypatch.setenv("FD_WEIGHT_CACHE", str(blocker / "cache"))
    with caplog.at_level("WARNING"):
        assert np.array_equal(packed(model_path, name), repacked)
    assert "not caching repacked weights in" in caplog.text and str(blocker) in caplog.text
