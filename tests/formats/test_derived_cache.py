"""GGUF headers kept on disk between starts (`DerivedCache`): a later start reads what the first
parsed, a changed file is parsed again, and the entries live within the weight cache's limit."""

from __future__ import annotations

import marshal
import os
import time
from pathlib import Path

import pytest
from gguf import GGUFEndian
from test_gguf_file import VALUES, _write

from fastdeploy.formats import gguf_file
from fastdeploy.formats.gguf_file import read_gguf

HOUR_NS = 3600 * 10**9


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("FD_WEIGHT_CACHE", str(directory))
    monkeypatch.delenv("FD_WEIGHT_CACHE_MAX_GB", raising=False)
    return directory


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files parsed from their bytes; each read starts as a new process would, with an empty
    in-process cache."""
    parsed: list[str] = []
    parse = gguf_file._read

    def counted(buffer, path):
        parsed.append(path)
        return parse(buffer, path)

    monkeypatch.setattr(gguf_file, "_read", counted)
    gguf_file._read_cached.cache_clear()
    yield parsed
    gguf_file._read_cached.cache_clear()


def fresh_read(path: Path) -> gguf_file.GGUFFile:
    gguf_file._read_cached.cache_clear()  # another start
    return read_gguf(path)


def entries(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.marshal")) if directory.exists() else []


def test_a_later_start_reads_the_parsed_header(tmp_path, cache, parses):
    path = tmp_path / "values.gguf"
    _write(path, GGUFEndian.LITTLE)
    first = fresh_read(path)
    assert parses == [str(path)] and len(entries(cache)) == 1
    second = fresh_read(path)
    assert parses == [str(path)]  # not parsed again
    assert second.metadata == first.metadata and list(second.metadata) == list(first.metadata)
    assert second.tensors == first.tensors and second.byte_order == "<"
    for key, (value, _) in VALUES.items():  # the values written, as gguf's writer wrote them
        assert second.metadata[key] == value, key
    assert second.metadata["t.nested"] == [[1, 2], [3]]


def test_a_changed_file_is_parsed_again(tmp_path, cache, parses):
    path = tmp_path / "values.gguf"
    _write(path, GGUFEndian.LITTLE)
    fresh_read(path)
    status = os.stat(path)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))  # touched
    fresh_read(path)
    assert len(parses) == 2
    # rewritten in place, same size, another value: parsed again, the new value read
    data = path.read_bytes()
    path.write_bytes(data.replace("héllo".encode(), "HÉLLO".encode()))
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 2 * 10**9))
    assert os.stat(path).st_size == status.st_size
    assert fresh_read(path).metadata["t.str"] == "HÉLLO 🌍"
    assert len(parses) == 3


def test_a_damaged_entry_is_parsed_again(tmp_path, cache, parses):
    path = tmp_path / "values.gguf"
    _write(path, GGUFEndian.BIG)
    expected = fresh_read(path).metadata
    (entry,) = entries(cache)
    for damage in (b"\x00garbage", marshal.dumps(("a", "b")), b""):
        entry.write_bytes(damage)
        assert fresh_read(path).metadata == expected
    assert len(parses) == 4


def test_off_writes_nothing(tmp_path, cache, parses, monkeypatch):
    monkeypatch.setenv("FD_WEIGHT_CACHE", "0")
    path = tmp_path / "values.gguf"
    _write(path, GGUFEndian.LITTLE)
    fresh_read(path)
    fresh_read(path)
    assert len(parses) == 2 and not cache.exists()


def test_headers_share_the_weight_caches_limit(tmp_path, cache, parses, monkeypatch):
    """An entry that would pass FD_WEIGHT_CACHE_MAX_GB evicts the least recently used weights;
    one larger than the whole limit is not written."""
    path = tmp_path / "values.gguf"
    _write(path, GGUFEndian.LITTLE)
    size = len(marshal.dumps(gguf_file._to_plain(fresh_read(path))))
    for entry in entries(cache):
        entry.unlink()
    old_weight = cache / "build-0123456789abcdef" / "ab" / ("ab" + "0" * 62 + ".bin")
    old_weight.parent.mkdir(parents=True)
    old_weight.write_bytes(b"\0" * 100)
    hours_ago = time.time_ns() - 5 * HOUR_NS
    os.utime(old_weight, ns=(hours_ago, hours_ago))
    monkeypatch.setenv("FD_WEIGHT_CACHE_MAX_GB", str((size + 50) / 1e9))
    fresh_read(path)
    assert not old_weight.exists() and len(entries(cache)) == 1
    for entry in entries(cache):
        entry.unlink()
    monkeypatch.setenv("FD_WEIGHT_CACHE_MAX_GB", str((size - 1) / 1e9))
    assert fresh_read(path).metadata["t.str"] == "héllo 🌍"
    assert not entries(cache)
