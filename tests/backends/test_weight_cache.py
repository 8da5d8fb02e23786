"""The on-disk cache of GGUF weights repacked for the cpu kernels (`FD_WEIGHT_CACHE`).

A file's blocks are repacked at its first start and read back at later ones; what comes back must
be what repacking gives, a replaced file must miss, and a cache that cannot be written must not
stop the engine. The entries stay within `FD_WEIGHT_CACHE_MAX_GB`, evicting the least recently
used (other builds' first, never one the load in progress uses).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from test_mixed_gguf_model import greedy, write_model
from test_native_kernels import requires_native

from fastdeploy import envs
from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.backends.cpu.native.weight_cache import WeightCache
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats import cache_limit
from fastdeploy.formats.derived_cache import DerivedCache
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
def test_a_large_cached_weight_is_used_where_it_lies(model_path, tmp_path, monkeypatch):
    """A later start maps an entry of MAP_CACHED_FROM bytes or more read-only instead of copying
    it: the kernels read the page cache's pages (shared by every process on the file), and a
    stray write fails loudly. A smaller entry is read into the arena (huge pages shared)."""
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    monkeypatch.setenv("FD_WEIGHT_CACHE", str(tmp_path / "cache"))
    tensor = dict(GGUFLoader().load_tensors(model_path))["model.layers.0.mlp.down_proj.weight"]
    first = CpuBackend(BackendOptions(threads=1)).linear_weight(tensor).packed
    small = CpuBackend(BackendOptions(threads=1)).linear_weight(tensor).packed
    assert first.nbytes < native.MAP_CACHED_FROM
    assert not isinstance(small, np.memmap) and small.flags.writeable
    monkeypatch.setattr(native, "MAP_CACHED_FROM", first.nbytes)  # as if it were a large weight
    mapped = CpuBackend(BackendOptions(threads=1)).linear_weight(tensor).packed
    assert not isinstance(first, np.memmap) and isinstance(mapped, np.memmap)
    assert not mapped.flags.writeable
    assert np.array_equal(first, small) and np.array_equal(first, mapped)
    with pytest.raises(ValueError, match="read-only"):
        mapped[0] = 1


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


# --- the size limit -----------------------------------------------------------------------------

HOUR_NS = 3600 * 10**9


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def put(path: Path, size: int, hours_ago: float) -> Path:
    """An entry file of `size` bytes last used `hours_ago` (its modification time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    moment = time.time_ns() - int(hours_ago * HOUR_NS)
    os.utime(path, ns=(moment, moment))
    return path


def stored(cache: WeightCache, name: str, size: int, hours_ago: float) -> Path:
    """Entry `name` of this build, as an earlier start left it."""
    return put(Path(cache.directory) / key(name)[:2] / f"{key(name)}.bin", size, hours_ago)


def names(root: Path) -> set[str]:
    return {path.name for path in entries(root)}


def bin_name(name: str) -> str:
    return f"{key(name)}.bin"


def test_the_least_recently_used_entries_are_evicted_first(tmp_path):
    cache = WeightCache(str(tmp_path), "build 1", limit=450)
    for index, name in enumerate("abcd"):
        stored(cache, name, 100, hours_ago=10 - index)  # a is the oldest, d the newest
    cache.write(key("e"), np.zeros(100, np.uint8))
    assert names(tmp_path) == {bin_name(name) for name in "bcde"}
    cache.write(key("f"), np.zeros(250, np.uint8))  # two must go for 250 more
    assert names(tmp_path) == {bin_name(name) for name in "def"}
    assert sum(path.stat().st_size for path in entries(tmp_path)) == 450


def test_a_read_marks_the_entry_used(tmp_path):
    earlier = WeightCache(str(tmp_path), "build 1", limit=300)
    for index, name in enumerate("abc"):
        stored(earlier, name, 100, hours_ago=10 - index)
    cache = WeightCache(str(tmp_path), "build 1", limit=300)
    assert cache.read_into(key("a"), np.empty(100, np.uint8))  # the oldest, read by this load
    entry = Path(cache.directory) / key("a")[:2] / bin_name("a")
    assert time.time_ns() - entry.stat().st_mtime_ns < HOUR_NS  # noatime disks: the time is set
    cache.write(key("d"), np.zeros(100, np.uint8))
    assert names(tmp_path) == {bin_name(name) for name in "acd"}


def test_entries_the_load_uses_are_never_evicted(tmp_path, caplog):
    cache = WeightCache(str(tmp_path), "build 1", limit=300)
    for index, name in enumerate("ab"):
        stored(cache, name, 100, hours_ago=10 - index)
    assert cache.mapped(key("a"), (100,), np.uint8) is not None  # mapped by this load: kept
    cache.write(key("c"), np.zeros(100, np.uint8))
    cache.write(key("d"), np.zeros(100, np.uint8))  # b (unused by this load) makes room
    assert names(tmp_path) == {bin_name(name) for name in "acd"}
    with caplog.at_level("INFO"):
        cache.write(key("e"), np.zeros(100, np.uint8))  # only this load's entries are left
        cache.write(key("f"), np.zeros(500, np.uint8))  # more than the whole limit
    assert names(tmp_path) == {bin_name(name) for name in "acd"}
    assert caplog.text.count("FD_WEIGHT_CACHE_MAX_GB") == 1  # reported once per load


def test_an_entry_another_process_used_since_the_scan_is_kept(tmp_path):
    cache = WeightCache(str(tmp_path), "build 1", limit=300)
    old_a, old_b = stored(cache, "a", 100, hours_ago=10), stored(cache, "b", 100, hours_ago=9)
    cache.write(key("c"), np.zeros(100, np.uint8))  # the scan happens here
    os.utime(old_a)  # another start reads a now
    cache.write(key("d"), np.zeros(100, np.uint8))
    assert old_a.exists() and not old_b.exists()
    assert sum(path.stat().st_size for path in entries(tmp_path)) == 300


def test_an_entry_evicted_by_another_load_stays_readable_where_it_is_mapped(tmp_path):
    reader = WeightCache(str(tmp_path), "build 1", limit=200)
    table = np.arange(25, dtype=np.float32)
    reader.write(key("a"), table)
    mapped = reader.mapped(key("a"), (25,), np.float32)
    os.utime(Path(reader.directory) / key("a")[:2] / bin_name("a"), ns=(0, 0))  # the oldest entry
    other = WeightCache(str(tmp_path), "build 1", limit=200)  # another process's load
    other.write(key("b"), np.zeros(150, np.uint8))
    assert names(tmp_path) == {bin_name("b")}
    assert np.array_equal(mapped, table)  # unlinked, not truncated: the mapping still reads it


@pytest.fixture
def new_process(monkeypatch):
    """No cache folder is known to be read by this process yet (earlier tests made some)."""
    monkeypatch.setattr(cache_limit, "_FOLDERS_READ_HERE", set())


def build_folder(root: Path, build: str) -> Path:
    """Where a cache of native build `build` keeps its entries, without making that cache here."""
    return root / ("build-" + hashlib.sha256(build.encode()).hexdigest()[:16])


def test_other_builds_entries_go_before_this_builds(tmp_path, new_process):
    cache = WeightCache(str(tmp_path), "build 2", limit=300)
    mine = stored(cache, "a", 100, hours_ago=50)  # older than the others' but readable here
    previous = SimpleNamespace(directory=str(build_folder(tmp_path, "build 1")))  # an older install's
    theirs = stored(previous, "b", 100, hours_ago=2)
    unversioned = put(tmp_path / key("c")[:2] / bin_name("c"), 100, hours_ago=1)  # the older flat layout
    cache.write(key("d"), np.zeros(100, np.uint8))
    assert mine.exists() and not theirs.exists() and unversioned.exists()
    assert not Path(previous.directory).exists()  # its emptied folders are removed too
    cache.write(key("e"), np.zeros(100, np.uint8))
    assert mine.exists() and not unversioned.exists() and not unversioned.parent.exists()
    cache.write(key("f"), np.zeros(100, np.uint8))
    assert names(tmp_path) == {bin_name(name) for name in "def"}
    assert Path(cache.directory).is_dir()


def test_the_header_caches_entries_are_this_processs_too(tmp_path, new_process, monkeypatch):
    """The GGUF header cache keeps its entries beside the weights under one limit: a weight write
    evicts an older build's entries before the headers this process reads, and a header write
    evicts them before this build's weights."""
    monkeypatch.setenv("FD_WEIGHT_CACHE", str(tmp_path))
    headers = DerivedCache("headers of this test")
    header = put(tmp_path / headers.folder / key("h")[:2] / f"{key('h')}.marshal", 100, hours_ago=50)
    cache = WeightCache(str(tmp_path), "build 2", limit=300)
    mine = stored(cache, "a", 100, hours_ago=40)
    older = build_folder(tmp_path, "build 1")
    theirs = put(older / key("b")[:2] / bin_name("b"), 100, hours_ago=1)
    cache.write(key("d"), np.zeros(100, np.uint8))
    assert header.exists() and mine.exists() and not theirs.exists()
    theirs = put(older / key("c")[:2] / bin_name("c"), 100, hours_ago=1)  # another install writes
    monkeypatch.setenv("FD_WEIGHT_CACHE_MAX_GB", str(400 / 1e9))  # room for the header once c is gone
    source = tmp_path / "model.gguf"
    source.write_bytes(b"a file the header was read from")
    headers.put(str(source), source.stat(), {"values": "x" * 40})
    assert header.exists() and mine.exists() and not theirs.exists()
    assert headers.get(str(source), source.stat()) == {"values": "x" * 40}


def test_files_the_cache_did_not_write_are_left_alone(tmp_path):
    """A cache directory shared with other files (`FD_WEIGHT_CACHE=~/models`): they are neither
    counted against the limit nor evicted, however old."""
    cache = WeightCache(str(tmp_path), "build 1", limit=200)
    foreign = [
        put(tmp_path / "pytorch_model.bin", 1000, hours_ago=100),
        put(tmp_path / "ab" / "weights.bin", 1000, hours_ago=100),
        put(tmp_path / "build-x" / "ab" / f"{key('z')}.bin", 1000, hours_ago=100),
        put(tmp_path / "models" / "cd" / f"{key('y')}.bin", 1000, hours_ago=100),
        put(tmp_path / "ab" / "download.bin.1.tmp", 1000, hours_ago=100),
    ]
    old = stored(cache, "a", 100, hours_ago=10)
    cache.write(key("b"), np.zeros(100, np.uint8))
    cache.write(key("c"), np.zeros(100, np.uint8))
    assert all(path.exists() for path in foreign)
    assert not old.exists()


def test_the_cache_leaves_a_twentieth_of_its_disk_free(tmp_path, monkeypatch):
    disk = SimpleNamespace(f_frsize=1, f_blocks=2000, f_bavail=300)  # 100 bytes are 5% of it
    monkeypatch.setattr(os, "statvfs", lambda path: disk)
    cache = WeightCache(str(tmp_path), "build 1", limit=10_000)
    for index, name in enumerate("ab"):
        stored(cache, name, 100, hours_ago=10 - index)
    cache.write(key("c"), np.zeros(100, np.uint8))
    cache.write(key("d"), np.zeros(100, np.uint8))  # 200 entries + 300 free - 100 kept free
    assert names(tmp_path) == {bin_name(name) for name in "abcd"}
    cache.write(key("e"), np.zeros(100, np.uint8))
    assert names(tmp_path) == {bin_name(name) for name in "bcde"}


def test_stale_temporary_files_are_removed(tmp_path):
    cache = WeightCache(str(tmp_path), "build 1", limit=1000)
    crashed = put(Path(cache.directory) / "ab" / f"{key('a')}.bin.123.tmp", 100, hours_ago=1)
    writing = put(Path(cache.directory) / "ab" / f"{key('b')}.bin.456.tmp", 100, hours_ago=0)
    cache.write(key("c"), np.zeros(100, np.uint8))
    assert not crashed.exists() and writing.exists()
    assert names(tmp_path) == {bin_name("c")}


def test_a_start_that_only_reads_scans_nothing(tmp_path):
    cache = WeightCache(str(tmp_path), "build 1", limit=1000)
    stored(cache, "a", 100, hours_ago=1)
    crashed = put(Path(cache.directory) / "ab" / f"{key('b')}.bin.123.tmp", 100, hours_ago=1)
    assert cache.read_into(key("a"), np.empty(100, np.uint8))
    assert crashed.exists()  # left for the next start that writes


@requires_native
def test_a_load_that_would_pass_the_limit_stays_within_it(model_path, tmp_path, monkeypatch):
    """A whole model whose entries are twice the limit: the load writes what fits, the limit holds
    after it and after a second start, and both decode as the float reference."""
    monkeypatch.setenv("FD_WEIGHT_CACHE", str(tmp_path / "unbounded"))
    reference = greedy(model_path, "numpy", monkeypatch)
    assert greedy(model_path, "auto", monkeypatch) == reference
    whole = sum(path.stat().st_size for path in entries(tmp_path / "unbounded"))
    limit = whole // 2
    monkeypatch.setenv("FD_WEIGHT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FD_WEIGHT_CACHE_MAX_GB", str(limit / 1e9))
    for _ in range(2):
        assert greedy(model_path, "auto", monkeypatch) == reference
        sizes = [path.stat().st_size for path in entries(tmp_path / "cache")]
        assert sizes and sum(sizes) <= limit


@requires_native
def test_a_limit_of_zero_turns_the_cache_off(model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    monkeypatch.setenv("FD_WEIGHT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FD_WEIGHT_CACHE_MAX_GB", "0")
    assert CpuBackend(BackendOptions(threads=1)).weight_cache is None
    packed(model_path, "model.layers.0.self_attn.o_proj.weight")
    assert not entries(tmp_path / "cache")


@pytest.mark.parametrize("value", ["lots", "-1", "1e12", "nan", "20GB"])
def test_a_bad_limit_is_refused_naming_the_variable(value, monkeypatch):
    monkeypatch.setenv("FD_WEIGHT_CACHE_MAX_GB", value)
    with pytest.raises(InvalidArgumentError, match=f"FD_WEIGHT_CACHE_MAX_GB.*{value!r}"):
        CpuBackend(BackendOptions(threads=1))


def test_the_limit_is_read_in_gigabytes(monkeypatch):
    monkeypatch.setenv("FD_WEIGHT_CACHE_MAX_GB", "0.5")
    assert envs.weight_cache_max_bytes() == 500_000_000
    monkeypatch.delenv("FD_WEIGHT_CACHE_MAX_GB")
    assert envs.weight_cache_max_bytes() == 20_000_000_000
