"""The cpu backend's KV cache is zeroed memory the kernel is told not to back with huge pages
(`kv_cache._zeroed`: a fresh cache's pages are first touched inside decode steps, where a huge
page's fault may compact memory synchronously)."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from fastdeploy.backends.cpu.kv_cache import allocate_native, allocate_numpy


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding `address` (/proc/self/smaps)."""
    flags, inside = None, False
    with open("/proc/self/smaps", encoding="ascii") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                start, end = (int(part, 16) for part in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
                break
    assert flags is not None, "no mapping holds the array"
    return flags


@pytest.mark.parametrize("kv_dtype", ["float32", "float16", "bfloat16", "int8"])
def test_native_and_numpy_caches_are_zeroed_writable_arrays_of_the_right_shape(kv_dtype):
    native = allocate_native(6, 16, 2, 8, kv_dtype)
    assert native.keys.shape == (6, 2, 8, 16) and native.values.shape == (6, 2, 16, 8)
    numpy_cache = allocate_numpy(96, 2, 8, kv_dtype)
    assert numpy_cache.keys.shape == numpy_cache.values.shape == (96, 2, 8)
    for cache in (native, numpy_cache):
        arrays = [cache.keys, cache.values] + (
            [cache.key_scales, cache.value_scales] if kv_dtype == "int8" else []
        )
        for array in arrays:
            assert not np.asarray(array, dtype=np.float32).any()
            array[-1] = 1  # writable, to the last element
            assert np.asarray(array[-1], dtype=np.float32).all()


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_NOHUGEPAGE"),
    reason="MADV_NOHUGEPAGE and /proc/self/smaps are Linux's",
)
def test_the_cache_is_advised_no_huge_pages():
    cache = allocate_native(64, 64, 3, 64, "float32")  # 3 MiB each: numpy alone would advise huge pages
    assert "nh" in vm_flags(cache.keys.ctypes.data)
    assert "nh" in vm_flags(cache.values.ctypes.data + cache.values.nbytes - 1)
