"""Host memory for the backends on the CPU: how much there is, and freed memory kept in the process.

Freed activation memory stays in the process instead of going back to the kernel. Why: numpy takes each large array (above glibc's mmap threshold, or past the top of the heap)
from fresh pages and returns them on free, so every forward pass pays the kernel to fault in and
zero its activations again: for one 448x448 image through the mid ERNIE-4.5-VL encoder, ~7,900
page faults and 13-58 ms of system CPU time per encode. Raising glibc's mmap threshold and its
trim threshold keeps freed arrays in the heap, where the next pass reuses them already mapped.
The heap then stays at its peak (the largest pass's activations) rather than shrinking between
passes. Only glibc has `mallopt`; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os

from fastdeploy.logger import get_logger

logger = get_logger(__name__)

# glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: arrays up to this size come from the heap (glibc's largest allowed threshold: 32 MiB on 64-bit)
MMAP_THRESHOLD = 32 << 20
#: free memory at the top of the heap kept rather than returned to the kernel
TRIM_THRESHOLD = 1 << 30
_THRESHOLDS = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


@functools.cache
def retain_freed_memory() -> bool:
    """Sets glibc's thresholds once per process; False where there is no glibc `mallopt`."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = all(mallopt(option, value) for option, value in _THRESHOLDS)
    if not done:
        logger.info("cpu backend: mallopt refused the heap thresholds; freed arrays go back to the kernel")
    return done


def physical_host_memory() -> int:
    """Bytes of physical memory of this host."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_host_memory() -> int:
    """MemAvailable from /proc/meminfo, or physical memory where that file does not exist."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return physical_host_memory()
