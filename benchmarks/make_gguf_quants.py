"""SmolLM2 GGUF files of other quantisation types, for `benchmarks/throughput.py --model PATH`.

The embedded SmolLM2 is a Q4_1 GGUF and no float checkpoint ships here, so its weights are first
dequantised (with `gguf`) into a float32 GGUF; then llama.cpp's own quantiser (llama-cpp-python's
`llama_model_quantize`, the tool behind llama-quantize) writes each type from it:

    python benchmarks/make_gguf_quants.py OUT_DIR [--types Q4_0,Q4_K_M,Q5_K_M,Q6_K,Q8_0]

Without llama-cpp-python, `--synthetic` writes SmolLM2-shaped files of one block type each (every
matrix random valid blocks of that type, with llama.cpp's fallback type for matrices whose width is
no multiple of 256, as its quantiser does): the speed of the kernels, not a usable model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

#: llama.cpp's file types (llama.h `llama_ftype`) by name
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15}
FTYPES |= {"Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30}
#: llama.cpp's type for a matrix whose width is no multiple of 256 (llama-quant.cpp)
FALLBACK = {
    "Q2_K": "IQ4_NL",
    "Q3_K": "IQ4_NL",
    "IQ4_XS": "IQ4_NL",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
}


def copy_metadata(reader: GGUFReader, writer: GGUFWriter) -> None:
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), value_type, sub_type)


def write(source: str, path: Path, matrix) -> None:
    """A copy of `source` whose tensors are `matrix(name, tensor)` (an array, or (blocks, type))."""
    reader = GGUFReader(source)
    writer = GGUFWriter(str(path), reader.fields["general.architecture"].contents())
    copy_metadata(reader, writer)
    for tensor in reader.tensors:
        made = matrix(tensor.name, tensor)
        if isinstance(made, tuple):
            writer.add_tensor(tensor.name, made[0], raw_dtype=made[1])
        else:
            writer.add_tensor(tensor.name, made)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def float32_matrix(name: str, tensor) -> np.ndarray:
    qtype = GGMLQuantizationType(tensor.tensor_type)
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return np.asarray(tensor.data, np.float32)
    return dequantize(tensor.data, qtype)


def synthetic_matrix(type_name: str, rng: np.random.Generator):
    def matrix(name: str, tensor):
        if len(tensor.shape) < 2:
            return float32_matrix(name, tensor)
        cols, rows = (int(n) for n in tensor.shape[:2])
        chosen = (
            type_name
            if cols % GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0] == 0
            else FALLBACK[type_name]
        )
        qtype = GGMLQuantizationType[chosen]
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (rows * cols // block_size, type_size), dtype=np.uint8)
        halves = (rng.choice([-1.0, 1.0], len(blocks)) * 2.0 ** rng.uniform(-12, -8, len(blocks))).astype(
            np.float16
        )
        for offset in HALF_OFFSETS[chosen]:
            blocks[:, offset : offset + 2] = halves.view(np.uint8).reshape(-1, 2)
        return blocks.reshape(rows, -1), qtype

    return matrix


#: where each type's float16 factors sit in its blocks
HALF_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82)}
HALF_OFFSETS |= {
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--types", default="Q4_0,Q4_K_M,Q5_K_M,Q6_K,Q8_0")
    parser.add_argument("--synthetic", action="store_true", help="random blocks of each block type instead")
    parser.add_argument(
        "--source", help="the GGUF to start from (default: the embedded SmolLM2, found through fastdeploy)"
    )
    args = parser.parse_args()
    if args.source:
        source = args.source
    else:  # llama-cpp-python's interpreter need not have fastdeploy when --source is given
        from fastdeploy.model_resolver import embedded_model_path

        source = embedded_model_path()
    args.out.mkdir(parents=True, exist_ok=True)
    types = args.types.split(",")
    if args.synthetic:
        for type_name in types:
            path = args.out / f"smollm2-synthetic-{type_name}.gguf"
            write(source, path, synthetic_matrix(type_name, np.random.default_rng(0)))
            print(path)
        return
    try:
        import llama_cpp
    except ImportError:
        sys.exit("llama-cpp-python is not installed here (pip install llama-cpp-python); or use --synthetic")
    float32 = args.out / "smollm2-f32.gguf"
    write(source, float32, float32_matrix)
    for type_name in types:
        path = args.out / f"smollm2-{type_name}.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = FTYPES[type_name]
        if llama_cpp.llama_model_quantize(str(float32).encode(), str(path).encode(), params) != 0:
            sys.exit(f"llama.cpp could not quantise {float32} to {type_name}")
        print(path)


if __name__ == "__main__":
    main()
