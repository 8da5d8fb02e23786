"""A size limit on a directory of cache entries, kept by evicting the least recently used.

Why: the weight cache (backends/cpu/native/weight_cache.py) gains an entry for every weight of
every GGUF file it sees, and every rebuild of the native extension makes all earlier entries
unreadable; unbounded, it fills the disk. Entries are `<key>.bin` files (repacked weights) or
`<key>.marshal` files (parsed GGUF headers, derived_cache.py) in `<root>/<xx>/` or
`<root>/build-<hash>/<xx>/`; their modification time is their last use (readers set it
explicitly: many disks are mounted noatime). The directory is scanned once, at the first write of
a load (a start that only reads scans nothing), then kept up to date by this process's own writes. Whatever the limit, the cache leaves `DISK_RESERVE` of its
disk free (measured at the scan), so it never fills a disk.

Eviction is safe beside other processes: an entry is removed with unlink, so one that another
process has open or mapped stays readable to it; one whose time changed since the scan (another
process used it) is kept; entries are written under a temporary name and renamed, so nothing reads
a partial one, and temporary files a crashed writer left behind are removed once they are older
than `STALE_TEMPORARY_S`.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from typing import Any

#: a temporary file untouched this long (seconds) belongs to a writer that died
STALE_TEMPORARY_S = 600.0
#: the share of its disk the cache leaves free, whatever its limit: it never fills a disk
DISK_RESERVE = 0.05
#: the names of entries, of their temporaries, of the folders that hold them (`<xx>`, the key's first
#: two digits) and of a build's folder: nothing else below the root is counted or removed, so a
#: directory shared with other files (a user's `FD_WEIGHT_CACHE=~/models`) loses none of them
ENTRY = re.compile(r"[0-9a-f]{64}\.(?:bin|marshal)")
TEMPORARY = re.compile(r"[0-9a-f]{64}\.(?:bin|marshal)\.[0-9]+\.tmp")
SHARD = re.compile(r"[0-9a-f]{2}")
BUILD = re.compile(r"build-[0-9a-f]{16}")

#: the build folders (names) whose entries some cache of this process reads: the weight cache's
#: for this native build, the header cache's for this Python (`read_here`). Every limit of the
#: process evicts other folders' entries first, so one cache does not take another's for an old build's.
_FOLDERS_READ_HERE: set[str] = set()


def read_here(folder: str) -> None:
    """Record that this process reads the entries of build folder `folder` (a path or its name)."""
    _FOLDERS_READ_HERE.add(os.path.basename(os.path.normpath(folder)))


class CacheLimit:
    """Keeps the entries below `root` within `limit` bytes; `current` is the folder of the
    entries the caller reads. Entries of folders no cache of this process reads (`read_here`),
    e.g. an older build's, are evicted first."""

    def __init__(self, root: str, current: str, limit: int) -> None:
        self.root = root
        read_here(current)
        self.limit = limit
        #: what the entries may take: `limit`, or less where the disk would keep under DISK_RESERVE
        #: free (set at the scan)
        self.budget = limit
        #: path -> (size, mtime_ns) of the entries at the scan and written since; None until then
        self._entries: dict[str, tuple[int, int]] | None = None
        self.total = 0
        #: entries this load read or wrote: never evicted by it
        self._in_use: set[str] = set()

    def used(self, path: str) -> None:
        """Mark entry `path` as just used (read) by this load: most recent, and not evicted by it."""
        self._in_use.add(path)
        with contextlib.suppress(OSError):
            os.utime(path)

    def make_room(self, size: int) -> bool:
        """Evict least recently used entries until `size` more bytes fit; False when they cannot
        (then the caller writes nothing): only entries this load uses are left."""
        if size > self.limit:
            return False
        entries = self._scan()
        if self.total + size <= self.budget:
            return True
        readable = {path: self._read_here(path) for path in entries if path not in self._in_use}
        for path in sorted(readable, key=lambda path: (readable[path], entries[path][1])):
            if self.total + size <= self.budget:
                break
            self._evict(path, other_build=not readable[path])
        return self.total + size <= self.budget

    def added(self, path: str, size: int) -> None:
        """Record entry `path` of `size` bytes, just written by this load."""
        entries = self._scan()
        previous = entries.get(path)
        self.total += size - (previous[0] if previous else 0)
        entries[path] = (size, time.time_ns())
        self._in_use.add(path)

    def _read_here(self, path: str) -> bool:
        """Whether entry `path` lies in a build folder this process reads (not the flat layout of old)."""
        folder = os.path.relpath(path, self.root).split(os.sep)[0]
        return folder in _FOLDERS_READ_HERE

    def _scan(self) -> dict[str, tuple[int, int]]:
        if self._entries is None:
            self._entries = {}
            stale = time.time_ns() - int(STALE_TEMPORARY_S * 1e9)
            for folder in _entry_folders(self.root):
                for name in _names(folder):
                    path = os.path.join(folder, name)
                    try:
                        status = os.stat(path)
                    except OSError:
                        continue  # removed meanwhile
                    if ENTRY.fullmatch(name):
                        self._entries[path] = (status.st_size, status.st_mtime_ns)
                    elif TEMPORARY.fullmatch(name) and status.st_mtime_ns < stale:
                        with contextlib.suppress(OSError):
                            os.unlink(path)
            self.total = sum(size for size, _ in self._entries.values())
            free, disk = _disk_space(self.root)
            self.budget = min(self.limit, self.total + free - int(disk * DISK_RESERVE))
        return self._entries

    def _evict(self, path: str, other_build: bool) -> None:
        assert self._entries is not None
        size, seen = self._entries.pop(path)
        with contextlib.suppress(OSError):  # gone: another process evicted it first
            mtime = os.stat(path).st_mtime_ns
            if mtime != seen:  # another process used it since the scan: now among the newest
                self._entries[path] = (size, mtime)
                return
            os.unlink(path)
        self.total -= size
        if other_build:  # no process of this build writes there: drop the emptied folders
            folder = os.path.dirname(path)
            while folder != self.root and folder.startswith(self.root + os.sep):
                try:
                    os.rmdir(folder)
                except OSError:
                    break
                folder = os.path.dirname(folder)


def write_entry(path: str, data: Any) -> None:
    """Write entry `path` (`data`: bytes-like) whole: under its temporary name (`TEMPORARY`), then
    renamed, so no reader sees part of it. Raises OSError, with the temporary file removed."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(temporary, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []  # removed meanwhile, or not a folder


def _entry_folders(root: str) -> Iterator[str]:
    """The `<xx>` folders of every build's entries below `root` (and of the flat layout of old)."""
    for name in _names(root):
        if SHARD.fullmatch(name):
            yield os.path.join(root, name)
        elif BUILD.fullmatch(name):
            build = os.path.join(root, name)
            yield from (os.path.join(build, shard) for shard in _names(build) if SHARD.fullmatch(shard))


def _disk_space(path: str) -> tuple[int, int]:
    """(bytes free to this user, bytes in all) on the disk that holds `path` or would hold it."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        status = os.statvfs(path)
    except OSError:  # no statvfs here (Windows): only the limit applies
        return 1 << 62, 0
    return status.f_bavail * status.f_frsize, status.f_blocks * status.f_frsize
