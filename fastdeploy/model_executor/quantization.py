"""Weight-only quantisation of float checkpoints at load: FastDeploy's `quantization="wint8" | "wint4"`.

The linear layers' float weights become GGML blocks as they stream from the loader: Q8_0 (32 int8
with one float16 scale) for `wint8`, Q4_1 (32 4-bit values with a float16 scale and minimum) for
`wint4`, with the output head in Q8_0 either way (llama.cpp's choice too: the head is the most
sensitive matrix, and at 8 bits it still reads 3.8x less than float32). The result is the
`GGMLTensor` the GGUF loader produces, so a backend that keeps GGUF blocks (the cpu backend's
native kernels) runs a quantised safetensors checkpoint exactly as it runs a GGUF: same kernels,
same speed.

Q8_0 blocks come from the `gguf` package's reference quantiser (llama.cpp's `quantize_row_q8_0_ref`).
Q4_1 blocks are fitted here: the reference takes the block's minimum and (maximum - minimum) / 15,
which wastes levels on outliers; `fit_q4_1` then refits scale and minimum by least squares to the
levels chosen, twice, and keeps whichever of the two fits has the smaller error, block by block
(measured on SmolLM2 with its weights moved off the 4-bit grid: perplexity +30% over float32 with
the reference quantiser, +23% fitted; see benchmarks/accuracy.py).

Which tensors: the 2-D weights of linear layers, recognised by transformers' naming (`*_proj.weight`:
attention and MLP projections, experts included; Mixtral's experts' `w1`/`w2`/`w3`; and `lm_head.weight`, or the embedding when the
head is tied to it); their input size must be a multiple of 32 (the block), else they stay float.
Norms, biases, routers (`mlp.gate.weight`) and an untied embedding stay float.

The backend chooses the form per method (`Platform.weight_layout`, default its `weight_packing`):
GGML blocks as above ("ggml"), or (the cuda backend: "weight_only") `WeightOnlyTensor`s instead,
in the layouts its Triton kernels read (fastdeploy/formats/weight_only.py): `wint8` per output
channel, `wint4` with one scale per `quantization_group_size` inputs, `fp8` block-wise
e4m3 with 128 x 128 scales. The head is wint8 under wint8 and wint4 (as above, the sensitive
matrix) and stays float under fp8 (as DeepSeek-V3's FP8 checkpoints keep it).

"weight_only_32" gives those `WeightOnlyTensor`s where the input width is a multiple of 32 and
keeps the rest float, as "ggml" does: the cpu backend's choice for `wint8` under
`FD_CPU_ACTIVATIONS=int8`, whose per-channel weights it multiplies by int8 activations
(native/gemm_w8a8.c, MoE experts included).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from fastdeploy.backends.platform import WEIGHT_LAYOUTS
from fastdeploy.config import ModelConfig
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.weight_only import FP8_BLOCK, WeightOnlyTensor, quantize_weight_only
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

BLOCK = 32
_FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class WeightQuantization:
    """A `quantization=` choice: the GGML block type of the layers and of the output head (None:
    no GGML form; only backends with "weight_only" packing list it)."""

    name: str
    layer_type: str | None
    head_type: str | None


#: what each of `config.QUANTIZATION_NAMES` becomes under "ggml" packing
QUANTIZATIONS = {
    "wint8": WeightQuantization("wint8", "Q8_0", "Q8_0"),
    "wint4": WeightQuantization("wint4", "Q4_1", "Q8_0"),
    "fp8": WeightQuantization("fp8", None, None),
}


def _is_head(name: str, tied: bool) -> bool:
    return name == "lm_head.weight" or (tied and name == "model.embed_tokens.weight")


#: Mixtral's experts: `block_sparse_moe.experts.N.w1 / w2 / w3` (gate, down, up)
_MIXTRAL_EXPERT = re.compile(r"\.experts\.\d+\.w[123]\.weight$")


def _is_linear(name: str) -> bool:
    return name.endswith("_proj.weight") or _MIXTRAL_EXPERT.search(name) is not None


def _levels(blocks: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> np.ndarray:
    """The nearest of the 16 levels minimum + scale * q for each weight."""
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
    return np.clip(np.rint((blocks - minimum) * inverse), 0, 15)


def _rounded(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).astype(np.float32)


def fit_q4_1(blocks: np.ndarray, refinements: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale [n, 1], minimum [n, 1], levels [n, 32] uint8) for float32 blocks [n, 32]: the reference
    min/max fit or its least-squares refinement, whichever is closer (scale and minimum rounded to
    float16, as stored)."""
    low, high = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
    scale, minimum = (high - low) / 15, low
    candidates = [(_rounded(scale), _rounded(minimum))]
    count = blocks.shape[1]
    total = blocks.sum(axis=1, keepdims=True)
    for _ in range(refinements):
        levels = _levels(blocks, scale, minimum)
        level_sum = levels.sum(axis=1, keepdims=True)
        level_squares = np.einsum("ij,ij->i", levels, levels)[:, None]
        cross = np.einsum("ij,ij->i", levels, blocks)[:, None]
        det = count * level_squares - level_sum * level_sum
        solvable = det > 0  # else every weight got the same level: keep the fit
        safe = np.where(solvable, det, 1)
        scale = np.where(solvable, (count * cross - level_sum * total) / safe, scale)
        minimum = np.where(solvable, (total - scale * level_sum) / count, minimum)
    candidates.append((_rounded(scale), _rounded(minimum)))
    best_error = None
    for scale, minimum in candidates:
        levels = _levels(blocks, scale, minimum)
        error = np.square(blocks - (scale * levels + minimum)).sum(axis=1, keepdims=True)
        if best_error is None:
            best_error, best = error, (scale, minimum, levels)
        else:
            better = error < best_error
            best_error = np.where(better, error, best_error)
            best = tuple(
                np.where(better, new, old) for new, old in zip((scale, minimum, levels), best, strict=True)
            )
    scale, minimum, levels = best
    return scale, minimum, levels.astype(np.uint8)


def quantize_q4_1(matrix: np.ndarray) -> np.ndarray:
    """GGUF Q4_1 rows ([out, in / 32 * 20] uint8) of a float32 [out, in] matrix, fitted by `fit_q4_1`."""
    rows, cols = matrix.shape
    blocks = matrix.reshape(-1, BLOCK)
    out = np.empty((blocks.shape[0], 20), np.uint8)
    step = 1 << 16  # blocks per pass, to bound the temporaries
    for start in range(0, blocks.shape[0], step):
        scale, minimum, levels = fit_q4_1(blocks[start : start + step])
        part = out[start : start + step]
        part[:, 0:2] = scale.astype(np.float16).view(np.uint8)
        part[:, 2:4] = minimum.astype(np.float16).view(np.uint8)
        part[:, 4:] = levels[:, :16] | (levels[:, 16:] << 4)  # byte i: level i | level i + 16 << 4
    return out.reshape(rows, cols // BLOCK * 20)


def quantize_matrix(matrix: np.ndarray, type_name: str) -> GGMLTensor:
    """GGML blocks of an [out, in] float matrix (in a multiple of 32)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[type_name]
    values = np.ascontiguousarray(matrix, dtype=np.float32)
    rows = quantize_q4_1(values) if qtype == GGMLQuantizationType.Q4_1 else quantize(values, qtype)
    return GGMLTensor(int(qtype), rows, values.shape)


def _weight_only(matrix: np.ndarray, quantization: str, head: bool, group_size: int) -> Any:
    """The "weight_only" packing of one matrix (see the module docstring), or the matrix itself."""
    if head:
        return matrix if quantization == "fp8" else quantize_weight_only(matrix, "wint8")
    if quantization == "wint4" and matrix.shape[1] % group_size:
        return quantize_weight_only(matrix, "wint8")  # `check_quantization_shapes` names the widths
    return quantize_weight_only(matrix, quantization, group_size)


def quantize_tensors(
    tensors: Iterable[tuple[str, Any]],
    quantization: str,
    tie_word_embeddings: bool,
    source: str,
    layout: str = "ggml",
    group_size: int = 128,
) -> Iterator[tuple[str, Any]]:
    """The loader's (name, tensor) stream with linear-layer weights quantised in `layout` (one of
    `WEIGHT_LAYOUTS`, the backend's `weight_layout`): GGML blocks or `WeightOnlyTensor`s (wint4
    groups of `group_size`)."""
    if layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"unknown weight layout {layout!r}; known: {', '.join(WEIGHT_LAYOUTS)}")
    method = QUANTIZATIONS[quantization]
    kept_float: list[str] = []
    for name, tensor in tensors:
        head = _is_head(name, tie_word_embeddings)
        if not (head or _is_linear(name)) or len(tensor.shape) != 2:
            yield name, tensor
            continue
        if (
            isinstance(tensor, (GGMLTensor, WeightOnlyTensor))
            or np.dtype(tensor.dtype).name not in _FLOAT_DTYPES
        ):
            kind = tensor.type_name if isinstance(tensor, GGMLTensor) else np.dtype(tensor.dtype).name
            raise InvalidArgumentError(
                f"quantization={quantization!r} needs a float32, float16 or bfloat16 checkpoint, but "
                f"{name} of {source} is {kind}; load it without quantization= (its own weights are "
                "used as they are)"
            )
        if layout == "weight_only":
            yield name, _weight_only(np.asarray(tensor), quantization, head, group_size)
            continue
        if tensor.shape[1] % BLOCK:
            kept_float.append(name)
            yield name, tensor
            continue
        if layout == "weight_only_32":
            yield name, _weight_only(np.asarray(tensor), quantization, head, group_size)
            continue
        yield name, quantize_matrix(np.asarray(tensor), method.head_type if head else method.layer_type)
    if kept_float:
        logger.info(
            "quantization=%s: %d matrices kept in float (input size not a multiple of %d): %s",
            quantization,
            len(kept_float),
            BLOCK,
            ", ".join(kept_float[:4]),
        )


def linear_input_widths(config: ModelConfig) -> dict[str, int]:
    """The input widths of a decoder's linear layers, from config.json (before any weight)."""
    raw = config.raw
    widths = {
        "hidden_size": config.hidden_size,
        "num_attention_heads * head_dim": config.num_attention_heads * config.head_dim,
        "intermediate_size": config.intermediate_size,
    }
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        value = raw.get(key)
        if isinstance(value, int) and value > 0:
            widths[key] = value
    return widths


def check_quantization_shapes(
    quantization: str | None, group_size: int, config: ModelConfig, layout: str
) -> None:
    """Refuse wint4 in `WeightOnlyTensor` groups (`layout` "weight_only" or "weight_only_32") whose
    group size does not divide every linear layer's input width (checked from config.json at
    construction, before the weights load)."""
    if quantization != "wint4" or layout not in ("weight_only", "weight_only_32"):
        return
    bad = {name: width for name, width in linear_input_widths(config).items() if width % group_size}
    if bad:
        listed = ", ".join(f"{name} = {width}" for name, width in bad.items())
        raise InvalidArgumentError(
            f"quantization='wint4' with quantization_group_size={group_size} needs every linear layer's "
            f"input width to be a multiple of {group_size}, but this model's {listed}; supported: "
            "quantization_group_size 64 or 128 dividing those widths, or quantization='wint8' / 'fp8'"
        )


def fp8_block_checkpoint(config: ModelConfig) -> bool:
    """Whether config.json declares block-wise FP8 weights with 128 x 128 scales (DeepSeek-V3's and
    Qwen3-FP8's `quantization_config`: quant_method "fp8", weight_block_size [128, 128])."""
    quant = config.raw.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "fp8":
        return False
    block = quant.get("weight_block_size")
    if list(block or ()) != [FP8_BLOCK, FP8_BLOCK]:
        raise InvalidArgumentError(
            f"FP8 checkpoints are read with 128 x 128 block scales (weight_block_size [128, 128]); this "
            f"one declares weight_block_size {block!r}"
        )
    return True


def pair_fp8_scales(tensors: Iterable[tuple[str, Any]], source: str) -> Iterator[tuple[str, Any]]:
    """A block-FP8 checkpoint's stream with each e4m3 `X.weight` and its `X.weight_scale_inv`
    joined into one `WeightOnlyTensor` ("fp8") under `X.weight` (the two may sit in different
    shards: the first waits, memory-mapped, for the second). Other tensors pass unchanged."""
    pending: dict[str, Any] = {}
    for name, tensor in tensors:
        if name.endswith(".weight_scale_inv"):
            base = name[: -len("_scale_inv")]
        elif name.endswith(".weight") and np.dtype(tensor.dtype) == np.dtype(ml_dtypes.float8_e4m3fn):
            base = name
        else:
            yield name, tensor
            continue
        if base not in pending:
            pending[base] = (name, tensor)
            continue
        _, other = pending.pop(base)
        weight, scales = (tensor, other) if name == base else (other, tensor)
        yield (
            base,
            WeightOnlyTensor(
                "fp8",
                np.asarray(weight).view(np.uint8),
                np.asarray(scales, dtype=np.float32),
                tuple(weight.shape),
            ),
        )
    if pending:
        raise InvalidArgumentError(
            f"FP8 checkpoint {source}: {', '.join(sorted(pending)[:4])} without its weight / "
            "weight_scale_inv partner"
        )
