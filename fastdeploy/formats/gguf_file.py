"""Reads a GGUF file: its key/value metadata, its tensor table, and views of its tensor data.

Why not `gguf.GGUFReader`: it parses every field into numpy views of a memory map, one view
per array element, which takes 2-4 s for the ~100k vocabulary strings and merges of a small
model's tokenizer (measured on SmolLM2-135M, 93 MB), and an engine start reads the file for the
config, the tokenizer and the weights. This reader walks the same layout (GGUF v2/v3, either
byte order) with `struct` and `numpy.frombuffer` and returns plain Python values in ~0.1 s;
tensor data stays memory-mapped and is dequantised by the `gguf` package. The tests check every
metadata value and tensor against `GGUFReader`.

Layout (all integers in the file's byte order): magic "GGUF", uint32 version, uint64 tensor
count, uint64 key/value count, then per pair a string key, a uint32 value type and the value.
A string is a uint64 byte length and UTF-8 bytes; an array is a uint32 element type, a uint64
count and the elements. Then per tensor: a string name, uint32 dimension count, uint64
dimensions (innermost first), uint32 ggml type and uint64 data offset, relative to the data
section, which starts at the next multiple of `general.alignment` (default 32).
"""

from __future__ import annotations

import functools
import mmap
import os
import re
import struct
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fastdeploy.errors import UnsupportedModelError
from fastdeploy.formats.derived_cache import DerivedCache
from fastdeploy.formats.ggml_types import F16, F32, ggml_type

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)

# GGUF value type codes (the `gguf` package's GGUFValueType).
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32 = 0, 1, 2, 3, 4, 5, 6
_BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = 7, 8, 9, 10, 11, 12

#: struct format and numpy dtype (without byte order) of each fixed-size type.
_SCALARS: dict[int, tuple[str, str]] = {
    _UINT8: ("B", "u1"),
    _INT8: ("b", "i1"),
    _UINT16: ("H", "u2"),
    _INT16: ("h", "i2"),
    _UINT32: ("I", "u4"),
    _INT32: ("i", "i4"),
    _FLOAT32: ("f", "f4"),
    _BOOL: ("?", "?"),
    _UINT64: ("Q", "u8"),
    _INT64: ("q", "i8"),
    _FLOAT64: ("d", "f8"),
}


class _Cursor:
    """A read position in the mapped file, in the file's byte order."""

    def __init__(self, buffer: mmap.mmap, path: str, order: str) -> None:
        self.buffer = buffer
        self.path = path
        self.order = order  # "<" or ">"
        self.offset = 0

    def _need(self, size: int, what: str) -> None:
        if self.offset + size > len(self.buffer):
            raise UnsupportedModelError(
                f"{self.path} is truncated: reading {what} at byte {self.offset} needs {size} bytes "
                f"but the file has {len(self.buffer)}; re-download or re-convert it"
            )

    def scalar(self, value_type: int, what: str) -> Any:
        fmt, _ = _SCALARS[value_type]
        size = struct.calcsize(fmt)
        self._need(size, what)
        (value,) = struct.unpack_from(self.order + fmt, self.buffer, self.offset)
        self.offset += size
        return value

    def string(self, what: str) -> str:
        length = self.scalar(_UINT64, what)
        self._need(length, what)
        raw = self.buffer[self.offset : self.offset + length]
        self.offset += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UnsupportedModelError(f"{self.path}: {what} is not valid UTF-8 ({exc})") from None

    def value(self, value_type: int, what: str) -> Any:
        if value_type == _STRING:
            return self.string(what)
        if value_type == _ARRAY:
            return self.array(what)
        if value_type in _SCALARS:
            return self.scalar(value_type, what)
        raise UnsupportedModelError(
            f"{self.path}: {what} has unknown GGUF value type {value_type}; the file may be newer than "
            "this reader or corrupt"
        )

    def array(self, what: str) -> list[Any]:
        element_type = self.scalar(_UINT32, what)
        count = self.scalar(_UINT64, what)
        if element_type in _SCALARS:
            _, dtype = _SCALARS[element_type]
            item_size = np.dtype(dtype).itemsize
            self._need(count * item_size, what)
            values = np.frombuffer(self.buffer, dtype=self.order + dtype, count=count, offset=self.offset)
            self.offset += count * item_size
            return values.tolist()
        if element_type == _STRING:
            return self._string_array(count, what)
        return [self.value(element_type, f"{what}[{index}]") for index in range(count)]

    def _string_array(self, count: int, what: str) -> list[str]:
        # The hot loop of a tokenizer's metadata (~50k tokens + ~50k merges): keep it lean.
        buffer, order_q, unpack, size = self.buffer, self.order + "Q", struct.unpack_from, len(self.buffer)
        offset = self.offset
        strings = []
        append = strings.append
        try:
            for _ in range(count):
                (length,) = unpack(order_q, buffer, offset)
                offset += 8
                end = offset + length
                if end > size:
                    raise struct.error("string runs past the end of the file")
                append(buffer[offset:end].decode("utf-8"))
                offset = end
        except struct.error:
            raise UnsupportedModelError(
                f"{self.path} is truncated inside {what} (element {len(strings)} of {count}); "
                "re-download or re-convert it"
            ) from None
        except UnicodeDecodeError as exc:
            raise UnsupportedModelError(
                f"{self.path}: element {len(strings)} of {what} is not valid UTF-8 ({exc})"
            ) from None
        self.offset = offset
        return strings


_DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of the tensor table."""

    name: str
    #: numpy order, outermost first (GGUF lists dimensions innermost first)
    shape: tuple[int, ...]
    ggml_type: int
    #: absolute byte offset of the data in the file
    offset: int
    #: the file holding the data when it is another shard of a split GGUF ("": the file itself)
    path: str = ""


@dataclass
class GGUFFile:
    """Metadata, tensor table and byte order of one GGUF file."""

    path: str
    metadata: dict[str, Any]
    tensors: list[GGUFTensorInfo]
    byte_order: str

    def tensor_data(self, info: GGUFTensorInfo) -> np.ndarray:
        """The tensor's bytes, memory-mapped, in the layout `gguf.quants.dequantize` takes.

        Float types come back typed and shaped; quantised types as uint8 rows of blocks.
        """
        if self.byte_order != "<":
            raise UnsupportedModelError(f"{self.path}: big-endian GGUF tensor data is not supported")
        _, block_size, type_size = ggml_type(info.ggml_type)  # known: the table read checked it
        elements = int(np.prod(info.shape))
        size = elements // block_size * type_size
        raw = np.memmap(info.path or self.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(size,))
        if info.ggml_type == F32:
            return raw.view(np.float32).reshape(info.shape)
        if info.ggml_type == F16:
            return raw.view(np.float16).reshape(info.shape)
        return raw.reshape(*info.shape[:-1], info.shape[-1] // block_size * type_size)


def read_gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All key/value pairs of a GGUF file's header, as plain Python values.

    Strings are `str`, numbers `int`/`float`/`bool`, arrays `list`. Raises
    `UnsupportedModelError` for a file that is not GGUF, a GGUF v1 file or a truncated one.
    """
    return read_gguf(path).metadata


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Metadata and tensor table of a GGUF file (tensor data is read later, on demand); a shard of a
    split GGUF (NAME-00001-of-00003.gguf, llama.cpp's gguf-split) reads as the whole model: the
    first shard's metadata and every shard's tensors.

    An engine start reads the file three times (config, tokenizer, weights): the parsed header is
    kept for a file whose path, size and modification time are unchanged. Treat it as read-only.
    """
    path = os.fspath(path)
    names = gguf_shard_names(os.path.basename(path))
    if len(names) == 1:
        return _read_file(path)
    shards = [os.path.join(os.path.dirname(path), name) for name in names]
    missing = [shard for shard in shards if not os.path.exists(shard)]
    if missing:
        raise UnsupportedModelError(
            f"{path} is one of {len(shards)} shards of a split GGUF, and {len(missing)} of them are "
            "missing: " + ", ".join(missing)
        )
    files = [_read_file(shard) for shard in shards]
    if len({file.byte_order for file in files}) != 1:
        raise UnsupportedModelError(f"the shards of {shards[0]} do not share one byte order")
    tensors = [replace(tensor, path=file.path) for file in files for tensor in file.tensors]
    return GGUFFile(shards[0], files[0].metadata, tensors, files[0].byte_order)


#: llama.cpp's gguf-split names: NAME-00001-of-00003.gguf
_SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


def gguf_shard_names(file_name: str) -> list[str]:
    """File names of every shard of the split GGUF that `file_name` belongs to (llama.cpp's
    gguf-split names: NAME-00001-of-00003.gguf), first to last; `[file_name]` for one whole file."""
    split = _SPLIT_NAME.match(file_name)
    if split is None or int(split["count"]) == 1:
        return [file_name]
    count = int(split["count"])
    return [f"{split['stem']}-{index:05d}-of-{count:05d}.gguf" for index in range(1, count + 1)]


#: parsed headers kept between starts; bump the version when what `_read` returns changes
_HEADERS = DerivedCache("gguf header v1")


def _read_file(path: str) -> GGUFFile:
    status = os.stat(path)
    return _read_cached(path, status.st_size, status.st_mtime_ns, status.st_ino)


@functools.lru_cache(maxsize=4)
def _read_cached(path: str, size: int, mtime_ns: int, inode: int) -> GGUFFile:
    """The header of `path` as it is now: from the disk cache (`DerivedCache`) when it holds it,
    else parsed, and stored there for later starts."""
    status = os.stat(path)
    stored = _from_plain(path, _HEADERS.get(path, status))
    if stored is not None:
        return stored
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size < 24:
            raise UnsupportedModelError(f"{path} is too small to be a GGUF file")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            parsed = _read(buffer, path)
    _HEADERS.put(path, status, _to_plain(parsed))
    return parsed


def _to_plain(parsed: GGUFFile) -> tuple[Any, ...]:
    """`parsed` as the plain values `DerivedCache` stores."""
    tensors = [(tensor.name, tensor.shape, tensor.ggml_type, tensor.offset) for tensor in parsed.tensors]
    return parsed.metadata, tensors, parsed.byte_order


def _from_plain(path: str, plain: Any) -> GGUFFile | None:
    """The `GGUFFile` of `_to_plain`'s values, or None for anything else (a damaged entry)."""
    try:
        metadata, tensors, byte_order = plain
        table = [GGUFTensorInfo(name, tuple(shape), kind, offset) for name, shape, kind, offset in tensors]
    except (TypeError, ValueError):
        return None
    if not isinstance(metadata, dict) or byte_order not in ("<", ">"):
        return None
    return GGUFFile(path, metadata, table, byte_order)


def _read_tensor_table(cursor: _Cursor, count: int, alignment: int) -> list[GGUFTensorInfo]:
    entries = []
    for index in range(count):
        name = cursor.string(f"tensor name #{index}")
        dims = [
            cursor.scalar(_UINT64, f"a dimension of {name!r}") for _ in range(cursor.scalar(_UINT32, name))
        ]
        ggml_type = cursor.scalar(_UINT32, f"the type of {name!r}")
        entries.append(
            (name, tuple(reversed(dims)), ggml_type, cursor.scalar(_UINT64, f"the offset of {name!r}"))
        )
    data_start = -(-cursor.offset // alignment) * alignment
    tensors = [
        GGUFTensorInfo(name, shape, kind, data_start + offset) for name, shape, kind, offset in entries
    ]
    for tensor in tensors:
        end = tensor.offset + _data_bytes(tensor, cursor.path)
        if end > len(cursor.buffer):
            raise UnsupportedModelError(
                f"{cursor.path} is truncated: the data of tensor {tensor.name!r} runs to byte {end}, "
                f"past the end of the file ({len(cursor.buffer)} bytes)"
            )
    return tensors


def _data_bytes(tensor: GGUFTensorInfo, path: str) -> int:
    """The bytes of a tensor's data; an unknown type, or a row that is no whole number of its
    type's blocks, is refused naming the file and the tensor."""
    kind = ggml_type(tensor.ggml_type)
    if kind is None:
        raise UnsupportedModelError(
            f"{path}: tensor {tensor.name!r} has GGML type {tensor.ggml_type}, which is not a known "
            "quantisation type (the file may be newer than the installed `gguf` package, or damaged)"
        )
    _, block_size, type_size = kind
    if tensor.shape and tensor.shape[-1] % block_size != 0:
        raise UnsupportedModelError(
            f"{path}: tensor {tensor.name!r} of type {kind.name} has rows of {tensor.shape[-1]} values, "
            f"expected a multiple of its block size {block_size}"
        )
    elements = 1
    for size in tensor.shape:
        elements *= size
    return elements // block_size * type_size


def _read(buffer: mmap.mmap, path: str) -> GGUFFile:
    if buffer[:4] != GGUF_MAGIC:
        raise UnsupportedModelError(f"{path} is not a GGUF file (it starts with {bytes(buffer[:4])!r})")
    (version,) = struct.unpack_from("<I", buffer, 4)
    order = "<"
    if version & 0xFFFF == 0:  # a big-endian file reads as a huge little-endian number
        (version,) = struct.unpack_from(">I", buffer, 4)
        order = ">"
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedModelError(
            f"{path} is GGUF version {version}; only versions {SUPPORTED_VERSIONS} are supported "
            "(re-convert the model with a current llama.cpp)"
        )
    cursor = _Cursor(buffer, path, order)
    cursor.offset = 8
    tensor_count = cursor.scalar(_UINT64, "the tensor count")
    kv_count = cursor.scalar(_UINT64, "the metadata count")
    metadata: dict[str, Any] = {}
    for index in range(kv_count):
        key = cursor.string(f"metadata key #{index}")
        value_type = cursor.scalar(_UINT32, f"the type of {key!r}")
        metadata[key] = cursor.value(value_type, repr(key))
    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    tensors = _read_tensor_table(cursor, tensor_count, alignment)
    return GGUFFile(path, metadata, tensors, order)
