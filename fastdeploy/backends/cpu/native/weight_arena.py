"""Packed weights on transparent huge pages (2 MiB), where the kernel offers them.

Why: a decode step reads every weight once, ~100 MB for SmolLM2, so on 4 KiB pages it touches
~25,000 pages a token, far more than the TLB holds, and every page's first line waits for a page
walk on top of its memory latency. On 2 MiB pages the same weights are ~50 pages (numpy advises
huge pages itself only for arrays of several MiB; one layer's weights are less). With the kernels'
prefetching, SmolLM2's single-stream decode went from 106 to 116 tok/s on the 2-core EPYC.

The arena hands out consecutive slices of large anonymous mappings advised `MADV_HUGEPAGE`
(Linux with transparent huge pages set to `always` or `madvise`); elsewhere, or where the advice
is refused, slices are still valid memory on ordinary pages. A slice keeps its mapping alive
(numpy's `base`), so the arena itself can go once the model is loaded.
"""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 << 20
#: bytes mapped at a time: a few of SmolLM2's weights; the untouched end of the last chunk costs
#: address space only
CHUNK = 64 << 20
#: slices start on cache-line-and-page boundaries (the kernels' loads and the prefetcher's streams)
ALIGN = 4096


class WeightArena:
    """Consecutive, page-aligned uint8 slices of huge-page-advised mappings."""

    def __init__(self) -> None:
        self._chunk: np.ndarray | None = None
        self._used = 0
        #: whether the kernel took the huge-page advice for the chunks mapped so far
        self.advised = False

    def empty(self, nbytes: int) -> np.ndarray:
        """An uninitialised uint8 array of `nbytes` bytes."""
        size = -(-nbytes // ALIGN) * ALIGN
        if self._chunk is None or self._used + size > self._chunk.size:
            self._chunk = self._map(max(CHUNK, -(-size // HUGE_PAGE) * HUGE_PAGE))
            self._used = 0
        out = self._chunk[self._used : self._used + nbytes]
        self._used += size
        return out

    def _map(self, size: int) -> np.ndarray:
        """`size` bytes starting on a 2 MiB boundary (mapped with one huge page's slack)."""
        # private: a shared anonymous mapping is shmem, which anonymous huge pages do not back
        mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advise = getattr(mmap, "MADV_HUGEPAGE", None)
        if advise is not None:
            try:
                mapping.madvise(advise)
                self.advised = True
            except OSError:  # a kernel without transparent huge pages
                pass
        memory = np.frombuffer(mapping, np.uint8)
        start = -memory.ctypes.data % HUGE_PAGE
        return memory[start : start + size]
