"""Whole models on the cpu backend's W8A8 products (quantization="wint8" with FD_CPU_ACTIVATIONS=int8:
int8 weights with a scale per output channel times activations quantised per row and 128 inputs),
on both instruction sets: prefill, decode's one-row products and the head of a dense Llama against a
float64 forward pass with those numerics, and a sparse-MoE model whose experts stay packed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny_checkpoints as tiny
import tiny_families as families
from token_match import assert_outputs_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.conformance.checkpoint import tiny_llama
from fastdeploy.backends.cpu import native
from fastdeploy.formats.weight_only import quantize_wint8

pytestmark = pytest.mark.skipif(
    native.unavailable_reason() is not None, reason="int8 activations need the native kernels"
)
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]


@pytest.fixture(params=["avx512", "avx2"])
def w8a8(request, monkeypatch) -> str:
    """FD_CPU_ACTIVATIONS=int8 on the kernels of one instruction set."""
    if native.ISAS.index(request.param) < native.ISAS.index(native.best_isa()):
        pytest.skip(f"no {request.param} here")
    monkeypatch.setenv("FD_CPU_ACTIVATIONS", "int8")
    monkeypatch.setenv("FD_CPU_KERNELS", request.param)
    return request.param


def packed_types(model) -> set[str]:
    """The packed types of every layer's linear weights and the head."""
    types = {model.lm_head.type_name}
    for layer in model.layers:
        types |= {layer.attention.qkv.type_name, layer.attention.o_proj.type_name}
        mlp = layer.mlp
        for expert in getattr(mlp, "experts", None) or [(mlp.gate_up, mlp.down)]:
            types |= {weight.type_name for weight in expert}
    return types


def test_dense_model_matches_a_float64_forward_with_w8a8_numerics(tmp_path, w8a8):
    config, weights = tiny_llama(str(tmp_path))  # widths 64 and 128: every product runs W8A8
    llm = LLM(model=str(tmp_path), quantization="wint8", max_model_len=64)
    model, backend = llm.llm_engine.runner.model, llm.llm_engine.backend
    assert packed_types(model) == {"W8A8"}
    # FastDeploy's wint8 of each matrix: levels [in, out] and a scale per output channel
    quantised = {name: quantize_wint8(value) for name, value in weights.items() if value.ndim == 2}
    levels = {name: q.qweight.T for name, q in quantised.items()}
    dequantised = {name: levels[name] * q.scales.astype(np.float64)[:, None] for name, q in quantised.items()}
    # the tied embedding is looked up dequantised (it is the head, stored once)
    table = dict(weights, **{"model.embed_tokens.weight": dequantised["model.embed_tokens.weight"]})

    def int8_product(h: np.ndarray, name: str) -> np.ndarray:
        return ref.int8_activation_product(h, levels[name], quantised[name].scales)

    expected = ref.llama_logits(table, config, PROMPT, int8_product)
    ours = tiny.prefill_logits(model, backend, PROMPT)
    weights_only = ref.llama_logits(dict(table, **dequantised), config, PROMPT)
    scale = np.abs(expected).max()
    # float32 sums of exact integer dots: only float32 rounding is left (1.3e-7 measured)
    assert np.abs(ours - expected).max() < 1e-5 * scale
    # the activations' rounding, which the reference models, moves the logits far more (2.4e-2)
    assert np.abs(weights_only - expected).max() > 1e-3 * scale
    # decode: one-row products through the engine, against the reference's greedy recomputation
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    (output,) = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)
    greedy = ref.greedy_tokens(lambda ids: ref.llama_logits(table, config, ids, int8_product), PROMPT, 8)
    assert list(output.outputs.token_ids) == greedy


def test_mixtral_experts_stay_packed_and_generate_transformers_tokens(tmp_path, w8a8):
    """Mixtral (`experts.N.w1/w2/w3`, widths 32): every expert is an int8 W8A8 weight (one byte
    per value plus a float32 scale per channel, not float32), and greedy decoding keeps
    transformers' float32 tokens, as int8 activations keep SmolLM2's (test_native_int8)."""
    families.write_checkpoint(tmp_path, "mixtral")
    tiny.write_ernie_tokenizer(tmp_path)
    references = json.loads(families.REFERENCES.read_text(encoding="utf-8"))["models"]["mixtral"]
    params = SamplingParams(temperature=0, max_tokens=families.NEW_TOKENS, ignore_eos=True)
    for prompt_set in references["prompt_sets"].values():
        llm = LLM(model=str(tmp_path), quantization="wint8", max_model_len=prompt_set["max_model_len"])
        model = llm.llm_engine.runner.model
        assert packed_types(model) == {"W8A8"}
        for layer in model.layers:
            for expert in layer.mlp.experts:
                for weight in expert:
                    channels = -(-weight.out_features // native.PANEL) * native.PANEL
                    assert weight.packed.nbytes == channels * (weight.in_features + 4)
        cases = prompt_set["cases"]
        outputs = llm.generate(
            [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases], params, use_tqdm=False
        )
        assert_outputs_match(outputs, [c["output_token_ids"] for c in cases])
