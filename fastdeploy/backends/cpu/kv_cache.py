"""The cpu backend's KV cache in each `kv_cache_dtype`: float32 (exact), float16, bfloat16, int8.

Narrower elements halve or quarter what attention reads per step (memory-bound on long contexts)
at the cost of rounding every cached key and value: float16 and bfloat16 round to nearest even;
int8 stores each kv head's vector of a position as round(x * 127 / max|x|) with one float32 scale
(max|x| / 127) per position and kv head.

A layer's cache is a `LayerKVCache`. The native kernels keep keys transposed per block
([blocks, kv_heads, head_dim, block_size]) and values [blocks, kv_heads, block_size, head_dim], with
scales [blocks, kv_heads, block_size]; the numpy path keeps both [slots, kv_heads, head_dim] with
scales [slots, kv_heads]. bfloat16 is raw uint16 bits for the native kernels and `ml_dtypes`'
bfloat16 for numpy.
"""

from __future__ import annotations

import contextlib
import mmap
from typing import NamedTuple

import ml_dtypes
import numpy as np

#: kv_cache_dtype -> the native kernels' enum kv_type (native.h)
KV_TYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "int8": 3}
_EMPTY = np.zeros(0, np.float32)


class LayerKVCache(NamedTuple):
    keys: np.ndarray
    values: np.ndarray
    #: int8 only: the float32 scale of each position's key / value vector (else empty)
    key_scales: np.ndarray = _EMPTY
    value_scales: np.ndarray = _EMPTY

    @property
    def kv_dtype(self) -> str:
        # a dict lookup: asked once per layer per step, and numpy's dtype.name takes microseconds
        name = _KV_DTYPE_OF_STORAGE.get(self.keys.dtype)
        return name if name is not None else self.keys.dtype.name  # ml_dtypes' bfloat16: its name


#: storage dtype -> kv_cache_dtype (the native kernels keep bfloat16 as raw uint16 bits)
_KV_DTYPE_OF_STORAGE = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float16): "float16",
    np.dtype(np.uint16): "bfloat16",
    np.dtype(np.int8): "int8",
}


def _storage_dtype(kv_dtype: str, native: bool) -> np.dtype:
    if kv_dtype == "bfloat16":
        if native:
            return np.dtype(np.uint16)
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(kv_dtype)


def _zeroed(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed array on ordinary 4 KiB pages (an anonymous mapping advised `MADV_NOHUGEPAGE`).

    Why: numpy advises transparent huge pages for large arrays. A cache's pages are first touched
    during generation, one block at a time, and where the kernel's THP `defrag` setting is
    `madvise` (the default) each such fault may compact memory synchronously, inside a decode
    step. On the 2-core EPYC the native attention's key/value writes of a SmolLM2 decode step
    took 15-20 thousand cycles a layer on a fresh cache advised huge pages, against 8-9.5 thousand
    on ordinary pages and 6 thousand on a cache whose pages were all touched beforehand (touching
    gigabytes at start-up is not an option). Elsewhere (no `mmap` advice) it is `np.zeros`.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    advise = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advise is None or nbytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.zeros(shape, dtype)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # a kernel without transparent huge pages: ordinary pages anyway
        mapping.madvise(advise)
    return np.frombuffer(mapping, dtype).reshape(shape)


def allocate_native(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, kv_dtype: str
) -> LayerKVCache:
    """One layer's cache in the native kernels' layout, zeroed."""
    dtype = _storage_dtype(kv_dtype, native=True)
    keys = _zeroed((num_blocks, num_kv_heads, head_dim, block_size), dtype)
    values = _zeroed((num_blocks, num_kv_heads, block_size, head_dim), dtype)
    if kv_dtype != "int8":
        return LayerKVCache(keys, values)
    scales = (num_blocks, num_kv_heads, block_size)
    return LayerKVCache(keys, values, _zeroed(scales, np.float32), _zeroed(scales, np.float32))


def allocate_numpy(num_slots: int, num_kv_heads: int, head_dim: int, kv_dtype: str) -> LayerKVCache:
    """One layer's cache for the numpy attention, zeroed."""
    dtype = _storage_dtype(kv_dtype, native=False)
    shape = (num_slots, num_kv_heads, head_dim)
    if kv_dtype != "int8":
        return LayerKVCache(_zeroed(shape, dtype), _zeroed(shape, dtype))
    scales = (num_slots, num_kv_heads)
    return LayerKVCache(
        _zeroed(shape, dtype), _zeroed(shape, dtype), _zeroed(scales, np.float32), _zeroed(scales, np.float32)
    )


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, float32 scales) of x [..., head_dim], one scale per vector of the last axis."""
    peak = np.abs(x).max(axis=-1, keepdims=True)
    inverse = np.divide(np.float32(127), peak, out=np.zeros_like(peak), where=peak > 0)
    values = np.clip(np.rint(x * inverse), -127, 127).astype(np.int8)
    return values, (peak[..., 0] / np.float32(127)).astype(np.float32)


def store_numpy(cache: LayerKVCache, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """Write this step's keys and values [tokens, kv_heads, head_dim] into their slots."""
    if cache.keys.dtype == np.int8:
        cache.keys[slots], cache.key_scales[slots] = quantize_int8(k)
        cache.values[slots], cache.value_scales[slots] = quantize_int8(v)
        return
    cache.keys[slots] = k.astype(cache.keys.dtype)
    cache.values[slots] = v.astype(cache.values.dtype)


def gather_numpy(cache: LayerKVCache, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 keys and values of `slots` (any index shape), [..., kv_heads, head_dim]."""
    keys = cache.keys[slots].astype(np.float32)
    values = cache.values[slots].astype(np.float32)
    if cache.keys.dtype == np.int8:
        keys *= cache.key_scales[slots][..., None]
        values *= cache.value_scales[slots][..., None]
    return keys, values


class LatentKVCache(NamedTuple):
    """One layer's "latent" cache (multi-head latent attention): [slots, lora + rope], the same
    layout for the native and the numpy paths (the latent attention runs in numpy)."""

    latent: np.ndarray


def allocate_latent(num_slots: int, width: int, kv_dtype: str) -> LatentKVCache:
    """One layer's latent cache, zeroed; float32, float16 or bfloat16 (models refuse int8)."""
    return LatentKVCache(_zeroed((num_slots, width), _storage_dtype(kv_dtype, native=False)))
