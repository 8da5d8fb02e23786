"""FastDeploy's pre-quantised `-Paddle` wint8 / wint4 weights: Paddle's own `weight_quantize` (its
CPU kernel writes the CUTLASS layout of sm_75+ GPUs) makes the bytes, and our reading of them must
give back the matrix it quantised; a whole pre-quantised ERNIE-4.5 MoE checkpoint must then
generate what the float checkpoint of the same (exactly representable) weights generates, on the
cpu backend (dequantised) and on the cuda backend's Triton kernels (kept packed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.errors import WeightLoadError
from fastdeploy.formats.paddle_weight_only import paddle_weight_only

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from tiny_checkpoints import (  # noqa: E402
    SPECS,
    paddle_config,
    paddle_tensors,
    pt_tensors,
    write_ernie_tokenizer,
    write_safetensors,
)

paddle = pytest.importorskip("paddle", reason="Paddle's weight_quantize makes the reference bytes")

ALGOS = {"wint8": ("weight_only_int8", 127), "wint4": ("weight_only_int4", 7)}


def weight_quantize(in_out: np.ndarray, kind: str, group_size: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Paddle's quantiser on a bfloat16 [in, out] weight (the layout FastDeploy stores), for sm_80."""
    try:
        tensor = paddle.to_tensor(np.ascontiguousarray(in_out, np.float32)).astype("bfloat16")
        q, s = paddle.nn.quant.weight_quantize(tensor, algo=ALGOS[kind][0], arch=80, group_size=group_size)
    except (RuntimeError, NotImplementedError) as exc:  # a build without the CPU kernel
        pytest.skip(f"this paddle build cannot run weight_quantize on the CPU: {exc}")
    return np.array(q), np.array(s.astype("float32"))


def representable(out_in: np.ndarray, kind: str, rng: np.random.Generator, group: int = 0) -> np.ndarray:
    """A [out, in] matrix Paddle quantises exactly: integer levels times a power-of-two scale per
    output (or per group of `group` inputs), each scale's level range reaching the maximum."""
    qmax = ALGOS[kind][1]
    out, inp = out_in.shape
    span = group or inp
    peak = np.abs(out_in).reshape(out, inp // span, span).max(axis=2)
    scales = 2.0 ** np.round(np.log2(np.maximum(peak, 1e-3) / qmax))
    steps = np.repeat(scales, span, axis=1)
    levels = np.clip(np.rint(out_in / steps), -qmax, qmax)
    levels[:, ::span] = qmax * rng.choice([-1, 1], size=(out, inp // span))
    return (levels * steps).astype(np.float32)


@pytest.mark.parametrize("kind", ["wint8", "wint4"])
@pytest.mark.parametrize("shape", [(128, 64), (64, 128), (192, 256), (96, 512)])
def test_the_layout_reads_back_what_paddle_quantised(kind, shape):
    rng = np.random.default_rng(shape[0] * 7 + shape[1])
    weight = representable(rng.standard_normal(shape), kind, rng)
    packed = paddle_weight_only(*weight_quantize(weight.T, kind), kind, "w")
    assert packed.kind == kind and packed.shape == shape
    np.testing.assert_array_equal(packed.dequantize(), weight)


@pytest.mark.parametrize("group", [64, 128])
def test_group_wise_int4_keeps_its_groups(group):
    rng = np.random.default_rng(group)
    weight = representable(rng.standard_normal((96, 256)), "wint4", rng, group)
    packed = paddle_weight_only(*weight_quantize(weight.T, "wint4", group), "wint4", "w")
    assert packed.group_size == group
    np.testing.assert_array_equal(packed.dequantize(), weight)


@pytest.mark.parametrize("kind", ["wint8", "wint4"])
def test_arbitrary_weights_round_to_the_nearest_level(kind):
    """Weights off the grid: each value within half a step of its own scale (Paddle's rounding)."""
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((64, 192)).astype(np.float32)
    q, scales = weight_quantize(weight.T, kind)
    back = paddle_weight_only(q, scales, kind, "w").dequantize()
    step = scales[:, None]  # the bfloat16 scale Paddle stored, one per output
    assert (np.abs(back - weight) <= step / 2 + np.abs(weight) * 2**-7 + 1e-6).all()


def test_a_shape_the_layout_cannot_hold_is_named():
    with pytest.raises(WeightLoadError, match=r"layers\.0\.o_proj: .*multiple of 64.*\[64, 96\]"):
        paddle_weight_only(np.zeros((64, 96), np.int8), np.ones(64, np.float32), "wint8", "layers.0.o_proj")
    with pytest.raises(WeightLoadError, match=r"weight_scale has shape \[32\]; expected \[64\]"):
        paddle_weight_only(np.zeros((64, 64), np.int8), np.ones(32, np.float32), "wint8", "x")


MOE = "ernie4_5_moe"
#: the tiny MoE at widths CUTLASS's 64-input tiles divide
WIDE = {"hidden_size": 64, "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 64}


def _is_linear(name: str) -> bool:
    return name.endswith("_proj.weight")


def _write_pair(root: Path, dense: str, experts: str) -> tuple[Path, Path]:
    """The tiny ERNIE-4.5 MoE as a float -Paddle checkpoint of representable weights, and the same
    weights pre-quantised the way FastDeploy stores them (`quant_weight` + `weight_scale`)."""
    config = SPECS[MOE]["config"] | WIDE
    rng = np.random.default_rng(11)
    tensors = {
        name: representable(value, experts if ".experts." in name else dense, rng)
        if _is_linear(name)
        else value
        for name, value in pt_tensors(MOE, config).items()
    }
    stored = paddle_tensors(MOE, tensors)
    quantised = {}
    for name, value in stored.items():
        if not _is_linear(name):
            quantised[name] = value
            continue
        base = name[: -len(".weight")]
        q, s = weight_quantize(value, experts if ".experts." in name else dense)
        quantised[base + ".quant_weight"], quantised[base + ".weight_scale"] = q, s
    names = {"float": stored, "quantised": quantised}
    quant_config = (
        {"quantization": dense}
        if dense == experts
        else {"quantization": "mix_quant", "dense_quant_type": dense, "moe_quant_type": experts}
    )
    dirs = []
    for label, content in names.items():
        directory = root / label
        directory.mkdir()
        write_safetensors(directory, content)
        write_ernie_tokenizer(directory)
        extra = {"quantization_config": quant_config, "is_quantized": True} if label == "quantised" else {}
        (directory / "config.json").write_text(json.dumps(paddle_config(config) | extra), encoding="utf-8")
        dirs.append(directory)
    return dirs[0], dirs[1]


@pytest.mark.parametrize(
    "device,dense,experts",
    # the interpreted Triton kernels are slow: torch-cpu runs the mixed file, which holds both kinds
    [
        ("cpu", "wint8", "wint8"),
        ("cpu", "wint4", "wint4"),
        ("cpu", "wint8", "wint4"),
        ("torch-cpu", "wint8", "wint4"),
    ],
)
def test_a_prequantised_paddle_checkpoint_generates_as_its_float_twin(
    tmp_path, monkeypatch, device, dense, experts
):
    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    float_dir, quant_dir = _write_pair(tmp_path, dense, experts)
    prompts = [{"prompt_token_ids": [1, 17, 42, 99, 5, 63, 120]}, {"prompt_token_ids": [3, 8, 150, 77, 21]}]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = {}
    for label, directory in (("float", float_dir), ("quantised", quant_dir)):
        llm = LLM(model=str(directory), device=device, max_model_len=64, block_size=4, enforce_eager=True)
        if label == "quantised" and device == "torch-cpu":
            summary = llm.llm_engine.backend.loaded_weights_summary()
            assert all(f"{kind} " in summary for kind in {dense, experts}), summary
        outputs = llm.generate(prompts, params, use_tqdm=False)
        tokens[label] = [list(output.outputs[0].token_ids) for output in outputs]
    assert tokens["quantised"] == tokens["float"]


def test_an_unsupported_prequantised_kind_is_named(tmp_path):
    _, quant_dir = _write_pair(tmp_path, "wint8", "wint8")
    config_path = quant_dir / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["quantization_config"] = {
        "quantization": "mix_quant",
        "dense_quant_type": "wint8",
        "moe_quant_type": "w4a8",
    }
    config_path.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(WeightLoadError, match=r"declares 'w4a8' weights; .* read in wint8, wint4"):
        LLM(model=str(quant_dir), device="cpu", max_model_len=64)
