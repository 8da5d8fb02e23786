"""Values derived from a file (a GGUF file's parsed header), kept on disk per file identity.

Why: parsing a GGUF header turns every vocabulary string and merge into a Python object one at a
time, ~150 ms of a start for a 100k-token vocabulary; loading the same values back with `marshal`
takes ~15 ms. A value is stored at the first start that derives it and read at later ones.

An entry is named by a hash of the file's identity (real path, size, modification time, inode),
so a replaced, rewritten or touched file misses and is derived again, and lies in the weight
cache's directory (`FD_WEIGHT_CACHE`; `0` turns this cache off too) in a folder of its own per
kind of value and Python version (`build-<hash>/<xx>/<key>.marshal`): the cache's size limit
(`FD_WEIGHT_CACHE_MAX_GB`, cache_limit.py) covers these entries with the repacked weights and
evicts them as it evicts those. Entries are written whole under a temporary name and renamed, so
no reader sees a partial one; one that does not load is treated as missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import sys
from typing import Any

from fastdeploy import envs
from fastdeploy.formats.cache_limit import CacheLimit, read_here, write_entry
from fastdeploy.logger import get_logger

logger = get_logger(__name__)


class DerivedCache:
    """Plain values (what `marshal` stores: dicts, lists, tuples, str, numbers) derived from files.

    `kind` names what is derived and its layout's version: change it when the derivation changes.
    """

    def __init__(self, kind: str) -> None:
        tag = f"{kind}|python {sys.version_info.major}.{sys.version_info.minor}|marshal {marshal.version}"
        self.folder = "build-" + hashlib.sha256(tag.encode()).hexdigest()[:16]
        read_here(self.folder)  # this process reads it: the weight cache's limit evicts it last

    def get(self, path: str, status: os.stat_result) -> Any | None:
        """The value stored for file `path` as it is now (`status`), or None."""
        entry = self._entry(path, status)
        if entry is None:
            return None
        try:
            with open(entry, "rb") as handle:
                value = marshal.loads(handle.read())
        except (OSError, EOFError, ValueError, TypeError):
            return None
        with contextlib.suppress(OSError):
            os.utime(entry)  # last use, for the size limit's eviction order (noatime disks)
        return value

    def put(self, path: str, status: os.stat_result, value: Any) -> None:
        """Store `value` for file `path` as it is now, when it fits the cache's size limit; a cache
        that cannot be written is skipped (the value is derived again at the next start)."""
        entry = self._entry(path, status)
        if entry is None:
            return
        data = marshal.dumps(value)
        root = envs.weight_cache_dir()
        limit = CacheLimit(root, os.path.join(root, self.folder), envs.weight_cache_max_bytes())
        if not limit.make_room(len(data)):
            return
        try:
            write_entry(entry, data)
        except OSError as error:
            logger.debug("not caching what was derived from %s in %s: %s", path, root, error)

    def _entry(self, path: str, status: os.stat_result) -> str | None:
        root = envs.weight_cache_dir()
        if not root or not envs.weight_cache_max_bytes():
            return None
        identity = f"{os.path.realpath(path)}|{status.st_size}|{status.st_mtime_ns}|{status.st_ino}"
        key = hashlib.sha256(identity.encode()).hexdigest()
        return os.path.join(root, self.folder, key[:2], key + ".marshal")
