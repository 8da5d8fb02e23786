"""The fast GGUF metadata reader, checked against the `gguf` package's reader and writer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter

from fastdeploy.errors import UnsupportedModelError
from fastdeploy.formats.gguf_file import read_gguf_metadata


def test_matches_gguf_reader_on_smollm2(smollm2_path: str) -> None:
    ours = read_gguf_metadata(smollm2_path)
    reference = GGUFReader(smollm2_path)
    keys = [name for name in reference.fields if not name.startswith("GGUF.")]
    assert list(ours) == keys
    for name in keys:
        assert ours[name] == reference.fields[name].contents(), name


VALUES: dict[str, tuple[Any, GGUFValueType]] = {
    "t.u8": (200, GGUFValueType.UINT8),
    "t.i8": (-100, GGUFValueType.INT8),
    "t.u16": (60000, GGUFValueType.UINT16),
    "t.i16": (-30000, GGUFValueType.INT16),
    "t.u32": (4_000_000_000, GGUFValueType.UINT32),
    "t.i32": (-2_000_000_000, GGUFValueType.INT32),
    "t.u64": (2**63 + 5, GGUFValueType.UINT64),
    "t.i64": (-(2**62), GGUFValueType.INT64),
    "t.f32": (0.5, GGUFValueType.FLOAT32),
    "t.f64": (1e300, GGUFValueType.FLOAT64),
    "t.bool": (True, GGUFValueType.BOOL),
    "t.str": ("héllo 🌍", GGUFValueType.STRING),
    "t.empty": ("", GGUFValueType.STRING),
}


def _write(path: Path, endianess: GGUFEndian) -> None:
    writer = GGUFWriter(str(path), "llama", endianess=endianess)
    for key, (value, value_type) in VALUES.items():
        writer.add_key_value(key, value, value_type)
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.25, -1.5])
    writer.add_array("t.strs", ["a", "", "Ġthe", "你好"])
    writer.add_array("t.bools", [True, False])
    writer.add_array("t.nested", [[1, 2], [3]])
    writer.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("endianess", [GGUFEndian.LITTLE, GGUFEndian.BIG])
def test_every_value_type(tmp_path: Path, endianess: GGUFEndian) -> None:
    path = tmp_path / "values.gguf"
    _write(path, endianess)
    metadata = read_gguf_metadata(path)
    assert metadata["general.architecture"] == "llama"
    for key, (value, _) in VALUES.items():
        assert metadata[key] == value, key
    assert metadata["t.ints"] == [1, -2, 3]
    assert metadata["t.floats"] == [0.25, -1.5]
    assert metadata["t.strs"] == ["a", "", "Ġthe", "你好"]
    assert metadata["t.bools"] == [True, False]
    assert metadata["t.nested"] == [[1, 2], [3]]


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(UnsupportedModelError, match="not a GGUF file"):
        read_gguf_metadata(path)


def test_tiny_file(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(UnsupportedModelError, match="too small"):
        read_gguf_metadata(path)


def test_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "values.gguf"
    _write(path, GGUFEndian.LITTLE)
    data = path.read_bytes()
    cut = data.index("Ġthe".encode()) + 2
    path.write_bytes(data[:cut])
    with pytest.raises(UnsupportedModelError, match="truncated"):
        read_gguf_metadata(path)


def test_old_version(tmp_path: Path) -> None:
    path = tmp_path / "v1.gguf"
    path.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + b"\0" * 32)
    with pytest.raises(UnsupportedModelError, match="version 1"):
        read_gguf_metadata(path)


def test_tensor_table_and_data_match_gguf_reader(smollm2_path: str) -> None:
    from fastdeploy.formats.gguf_file import read_gguf

    ours = read_gguf(smollm2_path)
    reference = GGUFReader(smollm2_path)
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    for mine, theirs in zip(ours.tensors, reference.tensors, strict=True):
        assert mine.ggml_type == int(theirs.tensor_type), mine.name
        assert mine.shape == tuple(int(d) for d in reversed(theirs.shape)), mine.name
        data = ours.tensor_data(mine)
        assert data.shape == theirs.data.shape and data.dtype == theirs.data.dtype, mine.name
        assert np.array_equal(data, theirs.data), mine.name


def test_written_tensors_round_trip(tmp_path: Path) -> None:
    from fastdeploy.formats.gguf_file import read_gguf

    path = tmp_path / "tensors.gguf"
    writer = GGUFWriter(str(path), "llama")
    first = np.arange(12, dtype=np.float32).reshape(3, 4)
    second = np.linspace(-1, 1, 6, dtype=np.float16).reshape(2, 3)
    writer.add_tensor("first", first)
    writer.add_tensor("second", second)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parsed = read_gguf(path)
    assert [t.name for t in parsed.tensors] == ["first", "second"]
    np.testing.assert_array_equal(parsed.tensor_data(parsed.tensors[0]), first)
    np.testing.assert_array_equal(parsed.tensor_data(parsed.tensors[1]), second)


def _write_blocks(path: Path) -> bytes:
    """A file with one Q4_K tensor [2, 256] of zero blocks; its bytes."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor(
        "blk.0.attn_q.weight", np.zeros((2, 144), np.uint8), raw_dtype=GGMLQuantizationType.Q4_K
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def _type_field(data: bytes, name: str) -> int:
    """Where the GGML type of tensor `name` sits in the tensor table (after its name and dims)."""
    start = data.index(name.encode()) + len(name)
    dims = int.from_bytes(data[start : start + 4], "little")
    return start + 4 + 8 * dims


def test_tensor_data_running_past_the_end_names_the_tensor(tmp_path: Path) -> None:
    from fastdeploy.formats.gguf_file import read_gguf

    path = tmp_path / "cut.gguf"
    data = _write_blocks(path)
    path.write_bytes(data[:-100])
    with pytest.raises(
        UnsupportedModelError, match=r"cut.gguf is truncated: the data of tensor 'blk.0.attn_q.weight'"
    ):
        read_gguf(path)


def test_unknown_quant_type_names_the_tensor(tmp_path: Path) -> None:
    from fastdeploy.formats.gguf_file import read_gguf

    path = tmp_path / "odd.gguf"
    data = bytearray(_write_blocks(path))
    at = _type_field(bytes(data), "blk.0.attn_q.weight")
    data[at : at + 4] = (250).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(
        UnsupportedModelError, match=r"odd.gguf: tensor 'blk.0.attn_q.weight' has GGML type 250"
    ):
        read_gguf(path)


def test_rows_that_are_no_whole_blocks_are_refused(tmp_path: Path) -> None:
    from fastdeploy.formats.gguf_file import read_gguf

    path = tmp_path / "rows.gguf"
    data = bytearray(_write_blocks(path))
    at = _type_field(bytes(data), "blk.0.attn_q.weight")
    data[at : at + 4] = int(GGMLQuantizationType.Q8_0).to_bytes(4, "little")  # 256 values: 8 Q8_0 blocks
    data[at - 16 : at - 8] = (100).to_bytes(8, "little")  # rows of 100 values
    path.write_bytes(bytes(data))
    with pytest.raises(
        UnsupportedModelError, match=r"rows of 100 values, expected a multiple of its block size 32"
    ):
        read_gguf(path)
