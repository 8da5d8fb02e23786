"""Hugging Face directories: config.json plus one or more (indexed) *.safetensors files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np

from fastdeploy.errors import WeightLoadError
from fastdeploy.model_executor.loaders.base import WeightLoader

_INDEX_FILE = "model.safetensors.index.json"


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise WeightLoadError(f"cannot read {path}: {exc}") from exc


def safetensors_files(model_dir: str) -> list[str]:
    """Shard paths in the order the index lists them (or all *.safetensors, sorted)."""
    index_path = os.path.join(model_dir, _INDEX_FILE)
    if os.path.isfile(index_path):
        weight_map = _read_json(index_path).get("weight_map", {})
        names = sorted(set(weight_map.values()))
        missing = [name for name in names if not os.path.isfile(os.path.join(model_dir, name))]
        if missing:
            raise WeightLoadError(f"{_INDEX_FILE} in {model_dir} lists shards that do not exist: {missing}")
    else:
        names = sorted(name for name in os.listdir(model_dir) if name.endswith(".safetensors"))
    if not names:
        held = ", ".join(sorted(os.listdir(model_dir))[:12])
        raise WeightLoadError(
            f"{model_dir} has no *.safetensors weight files (it holds: {held}); fastdeploy reads "
            "safetensors or GGUF weights, not PyTorch .bin/.pt files"
        )
    return [os.path.join(model_dir, name) for name in names]


def declares_architecture(model_path: str, architectures: tuple[str, ...]) -> bool:
    """Whether the directory's config.json names one of `architectures` (an unreadable or
    malformed config.json names none): how a family's loader claims its checkpoints."""
    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as handle:
            declared = json.load(handle).get("architectures") or []
    except (OSError, json.JSONDecodeError, AttributeError):
        return False
    return bool(set(declared) & set(architectures))


class SafetensorsLoader(WeightLoader):
    name = "safetensors"
    priority = 0
    reads = "a directory with config.json and *.safetensors weights"

    def can_load(self, model_path: str) -> bool:
        return os.path.isdir(model_path) and os.path.isfile(os.path.join(model_path, "config.json"))

    def load_config(self, model_path: str) -> dict[str, Any]:
        return _read_json(os.path.join(model_path, "config.json"))

    def load_tensors(self, model_path: str) -> Iterator[tuple[str, np.ndarray]]:
        for path in safetensors_files(model_path):
            yield from mapped_tensors(path)


def _numpy_dtype(name: str) -> np.dtype:
    if name == "BF16":
        return np.dtype(ml_dtypes.bfloat16)
    if name == "F8_E4M3":  # block-wise FP8 checkpoints (`model_executor/quantization.py` pairs scales)
        return np.dtype(ml_dtypes.float8_e4m3fn)
    if name not in _DTYPES:
        raise WeightLoadError(
            f"safetensors dtype {name} is not supported (supported: BF16, F8_E4M3, {', '.join(_DTYPES)})"
        )
    return np.dtype(_DTYPES[name])


#: safetensors dtype names -> numpy
_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}


def mapped_tensors(path: str) -> Iterator[tuple[str, np.ndarray]]:
    """(name, read-only array) for every tensor of one .safetensors file, memory-mapped.

    The format is an 8-byte little-endian header length, a JSON header giving each tensor's
    dtype, shape and byte range, then the data. The `safetensors` package's numpy API copies
    every tensor it returns; mapping the file instead means a tensor-parallel rank that keeps
    some rows or columns of a matrix reads only those pages of the file.
    """
    header_size, header = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    start = 8 + header_size
    for name, info in header.items():
        first, last = info["data_offsets"]
        if start + last > data.size:
            raise WeightLoadError(
                f"{path} is truncated: tensor {name} ends at byte {start + last}, the file has {data.size}"
            )
        dtype = _numpy_dtype(info["dtype"])
        yield name, np.asarray(data[start + first : start + last]).view(dtype).reshape(info["shape"])


def read_header(path: str) -> tuple[int, dict[str, Any]]:
    """A .safetensors file's header length and tensor entries ({name: {dtype, shape,
    data_offsets}}); `WeightLoadError` naming the file when it is not a readable header."""
    try:
        with open(path, "rb") as handle:
            header_size = int.from_bytes(handle.read(8), "little")
            if header_size > os.path.getsize(path) - 8:
                raise ValueError(f"its header of {header_size} bytes is longer than the file")
            header = json.loads(handle.read(header_size))
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        tensors = {name: info for name, info in header.items() if name != "__metadata__"}
        for name, info in tensors.items():
            first, last = info["data_offsets"]
            if not 0 <= first <= last:
                raise ValueError(f"tensor {name} has data_offsets {info['data_offsets']}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WeightLoadError(f"cannot read the safetensors header of {path}: {exc}") from exc
    return header_size, tensors
