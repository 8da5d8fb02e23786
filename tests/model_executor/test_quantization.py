"""`quantization="wint8" | "wint4"`: float checkpoints quantised at load into GGML blocks.

The reference for the quantised model is independent of our kernels: the `gguf` package
dequantises each linear weight's blocks (Q8_0 made by gguf's quantiser, Q4_1 by our fitted one,
which is checked against gguf's reference quantiser separately), and a float64 numpy forward pass
over those weights gives the greedy tokens the engine must reproduce.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.conformance.checkpoint import tiny_llama
from fastdeploy.backends.cpu import native
from fastdeploy.engine_args import add_engine_arguments, engine_kwargs
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.model_executor.quantization import quantize_q4_1, quantize_tensors

requires_native = pytest.mark.skipif(
    native.unavailable_reason() is not None, reason=f"native kernels: {native.unavailable_reason()}"
)
#: quantization -> (type of the layers' blocks, type of the output head's blocks)
BLOCK_TYPES = {"wint8": ("Q8_0", "Q8_0"), "wint4": ("Q4_1", "Q8_0")}


def gguf_round_trip(matrix: np.ndarray, type_name: str) -> np.ndarray:
    """The weights after quantisation: Q8_0 by gguf's quantiser, Q4_1 by ours; gguf dequantises."""
    qtype = GGMLQuantizationType[type_name]
    values = matrix.astype(np.float32)
    blocks = quantize_q4_1(values) if type_name == "Q4_1" else quantize(values, qtype)
    return dequantize(blocks, qtype).reshape(matrix.shape)


def expected_weights(weights: dict[str, np.ndarray], quantization: str) -> dict[str, np.ndarray]:
    """The checkpoint as the quantised model must see it: linear layers and the tied head through
    gguf's quantiser and dequantiser, everything else unchanged."""
    layer, head = BLOCK_TYPES[quantization]
    out = {}
    for name, value in weights.items():
        if name == "model.embed_tokens.weight":  # tiny_llama ties the head to the embedding
            out[name] = gguf_round_trip(value, head)
        elif name.endswith("_proj.weight"):
            out[name] = gguf_round_trip(value, layer)
        else:
            out[name] = value
    return out


@requires_native
@pytest.mark.parametrize("kernels", ["avx512", "avx2"])
@pytest.mark.parametrize("quantization", ["wint8", "wint4"])
def test_quantised_model_generates_the_reference_tokens(tmp_path, monkeypatch, kernels, quantization):
    if native.best_isa() != "avx512" and kernels == "avx512":
        pytest.skip("no AVX-512 here")
    monkeypatch.setenv("FD_CPU_KERNELS", kernels)
    config, weights = tiny_llama(str(tmp_path))
    quantised = expected_weights(weights, quantization)
    prompts = [[72, 101, 108, 108, 111, 44, 32], [87, 111, 114, 108, 100]]
    llm = LLM(model=str(tmp_path), quantization=quantization, max_model_len=64, block_size=4)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    expected = [
        ref.greedy_tokens(lambda ids: ref.llama_logits(quantised, config, ids), p, 12) for p in prompts
    ]
    float_tokens = [
        ref.greedy_tokens(lambda ids: ref.llama_logits(weights, config, ids), p, 12) for p in prompts
    ]
    assert_tokens_match([o.outputs.token_ids for o in outputs], expected)
    differs_from_float = expected != float_tokens
    # the reference tells a quantised model from the float one, so an engine that skipped
    # quantising would fail above
    assert differs_from_float


@pytest.mark.parametrize("spread", ["normal", "outliers", "constant"])
def test_fitted_q4_1_is_never_worse_than_the_reference_quantiser(spread):
    """Block by block, gguf's dequantisation of our Q4_1 blocks is at least as close to the weights
    as its own reference quantiser's blocks, and closer on average where there is room."""
    rng = np.random.default_rng(3)
    weights = rng.standard_normal((96, 256)).astype(np.float32)
    if spread == "outliers":
        weights[rng.random(weights.shape) < 0.02] *= 12
    elif spread == "constant":
        weights[:48] = 0.25  # every weight of a block equal: scale 0
    qtype = GGMLQuantizationType.Q4_1
    ours = dequantize(quantize_q4_1(weights), qtype).reshape(weights.shape)
    reference = dequantize(quantize(weights, qtype), qtype).reshape(weights.shape)
    our_error = np.square(ours - weights).reshape(-1, 32).sum(axis=1)
    reference_error = np.square(reference - weights).reshape(-1, 32).sum(axis=1)
    assert np.all(our_error <= reference_error * (1 + 1e-6) + 1e-12)
    if spread != "constant":
        assert our_error.sum() < 0.95 * reference_error.sum()


def test_which_tensors_are_quantised_and_to_what():
    rng = np.random.default_rng(0)
    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((50, 64)).astype(np.float32),
        "lm_head.weight": rng.standard_normal((50, 64)).astype(np.float16),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((64, 64)).astype(np.float32),
        "model.layers.0.self_attn.q_proj.bias": rng.standard_normal(64).astype(np.float32),
        "model.layers.0.mlp.experts.3.down_proj.weight": rng.standard_normal((64, 96)).astype(np.float32),
        "model.layers.0.mlp.gate.weight": rng.standard_normal((8, 64)).astype(np.float32),  # MoE router
        # Mixtral's experts (w1 gate, w2 down, w3 up) and router
        "model.layers.0.block_sparse_moe.experts.1.w2.weight": rng.standard_normal((64, 32)).astype(
            np.float32
        ),
        "model.layers.0.block_sparse_moe.gate.weight": rng.standard_normal((4, 64)).astype(np.float32),
        "model.layers.0.mlp.down_proj.weight": rng.standard_normal((64, 48)).astype(np.float32),  # 48 % 32
        "model.norm.weight": np.ones(64, np.float32),
    }
    out = dict(quantize_tensors(tensors.items(), "wint4", tie_word_embeddings=False, source="test"))
    kinds = {
        name: value.type_name if isinstance(value, GGMLTensor) else "float" for name, value in out.items()
    }
    assert kinds == {
        "model.embed_tokens.weight": "float",  # untied: only looked up, never multiplied
        "lm_head.weight": "Q8_0",
        "model.layers.0.self_attn.q_proj.weight": "Q4_1",
        "model.layers.0.self_attn.q_proj.bias": "float",
        "model.layers.0.mlp.experts.3.down_proj.weight": "Q4_1",
        "model.layers.0.mlp.gate.weight": "float",
        "model.layers.0.block_sparse_moe.experts.1.w2.weight": "Q4_1",
        "model.layers.0.block_sparse_moe.gate.weight": "float",
        "model.layers.0.mlp.down_proj.weight": "float",
        "model.norm.weight": "float",
    }
    np.testing.assert_array_equal(
        np.asarray(out["lm_head.weight"]), gguf_round_trip(tensors["lm_head.weight"], "Q8_0")
    )
    tied = dict(quantize_tensors(tensors.items(), "wint8", tie_word_embeddings=True, source="test"))
    assert tied["model.embed_tokens.weight"].type_name == "Q8_0"
    assert tied["model.layers.0.self_attn.q_proj.weight"].type_name == "Q8_0"


@pytest.mark.parametrize("value", ["wint3", "int4", "w4a8", 4])
def test_unknown_quantization_lists_the_allowed_values(value):
    with pytest.raises(InvalidArgumentError, match="quantization must be one of wint8, wint4"):
        LLM(model="/nonexistent", quantization=value)


def test_a_quantised_checkpoint_is_refused_naming_its_type():
    tensors = {"model.layers.0.self_attn.q_proj.weight": np.ones((64, 64), np.int8)}
    with pytest.raises(InvalidArgumentError, match=r"needs a float32, float16 or bfloat16 checkpoint.*int8"):
        list(quantize_tensors(tensors.items(), "wint8", tie_word_embeddings=True, source="model_dir"))
    qtype = GGMLQuantizationType.Q4_1
    blocks = GGMLTensor(int(qtype), quantize(np.ones((64, 64), np.float32), qtype), (64, 64))
    with pytest.raises(
        InvalidArgumentError, match="q_proj.weight of .* is Q4_1; load it without quantization="
    ):
        list(quantize_tensors([("model.layers.0.self_attn.q_proj.weight", blocks)], "wint4", True, "x.gguf"))


@requires_native
def test_the_embedded_q4_1_gguf_is_refused_at_construction():
    with pytest.raises(InvalidArgumentError, match=r"quantization='wint4' needs a float32.*is Q8_0"):
        LLM(quantization="wint4")


@pytest.mark.parametrize("device", ["cpu-numpy", "paddle-cpu"])
def test_a_backend_without_block_kernels_refuses(tmp_path, monkeypatch, device):
    tiny_llama(str(tmp_path))
    if device == "cpu-numpy":
        monkeypatch.setenv("FD_CPU_KERNELS", "numpy")
    with pytest.raises(
        InvalidArgumentError, match="quantization='wint8' cannot run on this backend.*it runs: no"
    ):
        LLM(model=str(tmp_path), device=device.split("-numpy")[0], quantization="wint8")


def test_bfloat16_and_float16_checkpoints_quantise():
    import ml_dtypes

    rng = np.random.default_rng(1)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        matrix = rng.standard_normal((16, 64)).astype(dtype)
        ((_, blocks),) = quantize_tensors([("x.up_proj.weight", matrix)], "wint8", False, "test")
        np.testing.assert_array_equal(np.asarray(blocks), gguf_round_trip(matrix.astype(np.float32), "Q8_0"))


def test_cli_flags_reach_the_engine_arguments():
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_kwargs(parser.parse_args(["--quantization", "wint4"]))["quantization"] == "wint4"
    defaults = engine_kwargs(parser.parse_args([]))
    assert defaults["quantization"] is None and defaults["enable_prefix_caching"] is True
    assert engine_kwargs(parser.parse_args(["--no-enable-prefix-caching"]))["enable_prefix_caching"] is False


def test_every_quantization_name_the_options_accept_has_a_recipe():
    from fastdeploy.config import QUANTIZATION_NAMES
    from fastdeploy.model_executor.quantization import QUANTIZATIONS

    assert tuple(QUANTIZATIONS) == QUANTIZATION_NAMES


def test_fp8_checkpoint_scales_pair_with_their_weights_and_a_lone_one_is_named():
    import ml_dtypes

    from fastdeploy.config import ModelConfig
    from fastdeploy.formats.weight_only import WeightOnlyTensor
    from fastdeploy.model_executor.quantization import fp8_block_checkpoint, pair_fp8_scales

    bits = np.full((4, 8), 0.5, ml_dtypes.float8_e4m3fn)
    stream = [
        ("a.o_proj.weight_scale_inv", np.array([[2.0]], np.float32)),
        ("a.norm.weight", np.ones(8, np.float32)),
        ("a.o_proj.weight", bits),
    ]
    out = dict(pair_fp8_scales(stream, "dir"))
    assert set(out) == {"a.norm.weight", "a.o_proj.weight"}
    packed = out["a.o_proj.weight"]
    assert isinstance(packed, WeightOnlyTensor) and packed.kind == "fp8" and packed.shape == (4, 8)
    np.testing.assert_array_equal(np.asarray(packed), np.ones((4, 8)))  # 0.5 x scale 2
    with pytest.raises(InvalidArgumentError, match="b.q_proj.weight without its weight / weight_scale_inv"):
        list(pair_fp8_scales([("b.q_proj.weight", bits)], "dir"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "vocab_size": 10,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]},
    }
    with pytest.raises(InvalidArgumentError, match=r"128 x 128 block scales.*\[64, 64\]"):
        fp8_block_checkpoint(ModelConfig.from_hf_dict(config))
    config["quantization_config"]["weight_block_size"] = [128, 128]
    assert fp8_block_checkpoint(ModelConfig.from_hf_dict(config))
