"""GGUF weights in the kernels' layout kept on disk, so a file's blocks are repacked once, not at
every start.

Why: the kernels read most GGUF block types in panels of their own (block_packing.c), and
repacking decodes every block: seconds of one core for a 0.3B model's K-quants, most of a start
that llama.cpp (which maps the file and uses the blocks where they lie) does in a fraction of a
second. The first start writes each packed weight here; later ones map an entry of a huge page or
more where it lies (`mapped`: no copy, no read of the blocks, pages shared with other processes)
and read a smaller one into the weight arena (`read_into`), where it shares huge pages with its
neighbours. A GGUF token embedding,
which the backend looks up as a float32 table, is kept dequantised the same way and mapped from
here instead of being dequantised again.

An entry is named by a hash of the blocks' origin (`GGMLTensor.origin`: file path, size,
modification time, tensor, any row selection), the weight kind and shape, and the native
extension's build, so a replaced file or a rebuilt extension misses and repacks. Entries lie in a
folder per build, `<directory>/build-<hash of the build>/<xx>/<key>.bin`, and are written whole
under a temporary name and renamed, so a crashed or concurrent start never reads a partial one.

The entries together stay within a size limit (`FD_WEIGHT_CACHE_MAX_GB`, default 20 GB: a few 7-8B
GGUFs' worth; see `envs.weight_cache_max_bytes`): a write that would pass it first evicts the least
recently used entries, those of other builds (which no start of this build can read) before any
of this build's, never one this load has read or written (formats/cache_limit.py). A load whose own
entries would pass the limit writes what fits and repacks the rest at every start. Whatever the
limit, the cache leaves 5% of its disk free.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os

import numpy as np

from fastdeploy.formats.cache_limit import DISK_RESERVE, CacheLimit, write_entry
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.logger import get_logger

logger = get_logger(__name__)


class WeightCache:
    """Arrays derived from GGUF blocks at load, stored by `key` in `directory`."""

    def __init__(self, directory: str, build: str, limit: int) -> None:
        #: what changes the layout besides the entry's own fields (the native extension's build)
        self.build = build
        #: this build's entries (other builds' folders beside it are only evicted)
        self.directory = os.path.join(directory, "build-" + hashlib.sha256(build.encode()).hexdigest()[:16])
        #: the entries' total size bound, `limit` bytes over every build's entries in `directory`
        self.limit = CacheLimit(directory, self.directory, limit)
        self._writable = True
        self._full_reported = False

    def key(self, parts: object, *fields: object) -> str | None:
        """The entry name of what is made from `parts` (GGMLTensors or arrays) and `fields`, or None
        when a part's origin is unknown (arrays, blocks made in memory): those are not cached."""
        origins = [part.origin if isinstance(part, GGMLTensor) else "" for part in parts]
        if not all(origins):
            return None
        text = "\n".join([self.build, *map(str, fields), *origins])
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".bin")

    def read_into(self, key: str, out: np.ndarray) -> bool:
        """Fill contiguous `out` from entry `key`; False (out untouched or partly written) when
        there is no entry of exactly out's size."""
        try:
            with open(self._path(key), "rb", buffering=0) as handle:
                if os.fstat(handle.fileno()).st_size != out.nbytes:
                    return False
                view = memoryview(out.reshape(-1).view(np.uint8))
                done = 0
                while done < len(view):  # one read() returns at most ~2 GiB
                    count = handle.readinto(view[done:])
                    if not count:
                        return False
                    done += count
        except OSError:
            return False
        self.limit.used(self._path(key))
        return True

    def mapped(
        self, key: str, shape: tuple[int, ...], dtype: np.dtype, writable: bool = True
    ) -> np.ndarray | None:
        """Entry `key` mapped as an array, or None when there is no entry of exactly that size.

        Nothing is copied: the array's pages are the page cache's, read on first use, and shared
        by every process that maps the entry (`writable`: copy-on-write, for the caller's own
        changes; else read-only). The mapping is advised huge pages: where the kernel keeps the
        file in 2 MiB folios (ext4 and xfs on Linux 6.x do), the weights are read through huge-page
        TLB entries, as from the `WeightArena`, without the copy into it (and its first-touch
        faults) that made up half of a cached start.
        """
        path = self._path(key)
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        try:
            with open(path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size != size or size == 0:
                    return None
                access = mmap.ACCESS_COPY if writable else mmap.ACCESS_READ
                mapping = mmap.mmap(handle.fileno(), size, access=access)
        except OSError:
            return None
        advise = getattr(mmap, "MADV_HUGEPAGE", None)
        if advise is not None:
            with contextlib.suppress(OSError):  # a kernel without transparent huge pages
                mapping.madvise(advise)
        self.limit.used(path)
        return np.frombuffer(mapping, dtype).reshape(shape).view(np.memmap)  # a memmap, as it is

    def write(self, key: str, data: np.ndarray) -> None:
        """Store `data` as entry `key` when it fits the limit; a directory that cannot be written is
        reported once, then left alone (the engine runs as it would without a cache)."""
        if not self._writable:
            return
        if not self.limit.make_room(data.nbytes):
            if not self._full_reported:
                self._full_reported = True
                logger.info(
                    "weight cache %s is full (%.1f GB: FD_WEIGHT_CACHE_MAX_GB, or %d%% of the disk left "
                    "free): weights of this load past it are repacked at every start",
                    self.directory,
                    self.limit.budget / 1e9,
                    100 * DISK_RESERVE,
                )
            return
        path = self._path(key)
        try:
            write_entry(path, memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8)))
        except OSError as error:
            self._writable = False
            logger.warning("not caching repacked weights in %s: %s (FD_WEIGHT_CACHE)", self.directory, error)
            return
        self.limit.added(path, data.nbytes)

    def dequantized(self, tensor: GGMLTensor) -> np.ndarray:
        """`tensor` as float32, mapped from the cache when it holds it, else dequantised and stored."""
        key = self.key([tensor], "float32", tensor.shape)
        if key is not None:
            cached = self.mapped(key, tuple(tensor.shape), np.float32)
            if cached is not None:
                return cached
        array = np.ascontiguousarray(tensor.dequantize(), np.float32)
        if key is not None:
            self.write(key, array)
        return array
