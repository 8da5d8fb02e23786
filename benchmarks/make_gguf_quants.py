"""SmolLM2 GGUF files of other quantisation types, for `benchmarks/throughput.py --model PATH`.

The embedded SmolLM2 is a Q4_1 GGUF and no float checkpoint ships here, so its weights are first
dequantised (with `gguf`) into a float32 GGUF; then llama.cpp's own quantiser (llama-cpp-python's
`llama_model_quantize`, the tool behind llama-quantize) writes each type from it:

    python benchmarks/make_gguf_quants.py OUT_DIR [--types Q4_0,Q4_K_M,Q5_K_M,Q6_K,Q8_0]

Without llama-cpp-python, `--synthetic` writes SmolLM2-shaped files of one block type each (every
matrix random valid blocks of that type, with llama.cpp's fallback type for matrices whose width is
no multiple of 256, as its quantiser does): the speed of the kernels, not a usable model.

`--ernie-shaped` starts instead from a random-weight float16 GGUF shaped like ERNIE-4.5-0.3B
(architecture `ernie4_5`: hidden 1024, 18 layers, 16 query / 2 key-value heads of 128, FFN 3072,
vocabulary 103424, tied embeddings) with the source's tokenizer padded to that vocabulary. Every
width is a multiple of 256, so each K-quant file runs every product in a K-quant type (SmolLM2's
576 makes llama.cpp fall back to legacy types); files are named ernie-0.3b-shaped-TYPE.gguf.
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


#: ERNIE-4.5-0.3B's shape (its config.json)
ERNIE_SHAPE = {
    "embedding_length": 1024,
    "block_count": 18,
    "head_count": 16,
    "head_count_kv": 2,
    "head_dim": 128,
    "feed_forward_length": 3072,
    "vocab_size": 103424,
}


def write_ernie_shaped(source: str, path: Path, rng: np.random.Generator) -> None:
    """A float16 `ernie4_5` GGUF of ERNIE-4.5-0.3B's shape, random weights (normal, std 0.02; norms
    one), and the tokenizer of `source` padded with unused ordinary tokens to the vocabulary."""
    shape = ERNIE_SHAPE
    hidden, heads, kv_heads, head_dim = (
        shape[k] for k in ("embedding_length", "head_count", "head_count_kv", "head_dim")
    )
    arch = "ernie4_5"
    writer = GGUFWriter(str(path), arch)
    writer.add_name("ERNIE-4.5-0.3B-shaped random weights")
    writer.add_block_count(shape["block_count"])
    writer.add_context_length(131072)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(shape["feed_forward_length"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(1)  # mostly float16
    reader = GGUFReader(source)
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field.contents()
        if name in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            extra = range(len(value), shape["vocab_size"])
            fill = {"tokenizer.ggml.tokens": [f"<unused_{i}>" for i in extra]}
            value = list(value) + fill.get(name, [1 if name.endswith("type") else 0.0] * len(extra))
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, value_type, sub_type)

    def random(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims, np.float32) * 0.02).astype(np.float16)

    ones = np.ones(hidden, np.float32)
    writer.add_tensor("token_embd.weight", random(shape["vocab_size"], hidden))
    writer.add_tensor("output_norm.weight", ones)
    ffn = shape["feed_forward_length"]
    for layer in range(shape["block_count"]):
        parts = {
            "attn_norm": ones,
            "attn_q": random(heads * head_dim, hidden),
            "attn_k": random(kv_heads * head_dim, hidden),
            "attn_v": random(kv_heads * head_dim, hidden),
            "attn_output": random(hidden, heads * head_dim),
            "ffn_norm": ones,
            "ffn_gate": random(ffn, hidden),
            "ffn_up": random(ffn, hidden),
            "ffn_down": random(hidden, ffn),
        }
        for part, array in parts.items():
            writer.add_tensor(f"blk.{layer}.{part}.weight", array)
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
        "--ernie-shaped", action="store_true", help="quantise a random ERNIE-4.5-0.3B-shaped model instead"
    )
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
    if args.ernie_shaped:
        stem = "ernie-0.3b-shaped"
        float_file = args.out / f"{stem}-f16.gguf"
        write_ernie_shaped(source, float_file, np.random.default_rng(0))
    else:
        stem = "smollm2"
        float_file = args.out / f"{stem}-f32.gguf"
        write(source, float_file, float32_matrix)
    for type_name in types:
        path = args.out / f"{stem}-{type_name}.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = FTYPES[type_name]
        if llama_cpp.llama_model_quantize(str(float_file).encode(), str(path).encode(), params) != 0:
            sys.exit(f"llama.cpp could not quantise {float_file} to {type_name}")
        print(path)


if __name__ == "__main__":
    main()
