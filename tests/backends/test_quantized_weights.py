"""The cuda backend keeps quantised linear weights packed (torch-cpu, Triton interpreted): the
backend's ops against float64 products, a whole quantised model against a numpy forward pass over
independently dequantised weights, and the refusals at construction."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from quant_reference import fp8_reference, wint4_reference, wint8_reference

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.capabilities import Capability
from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.conformance.checkpoint import tiny_llama
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.weight_only import quantize_fp8, quantize_wint4, quantize_wint8
from fastdeploy.model_executor.model_loader import check_backend_quantization

pytest.importorskip("torch", reason="Triton's interpreter needs torch (the test extra installs it)")
pytest.importorskip("triton", reason="the kernels are Triton kernels (the test extra installs triton)")
from fastdeploy.backends.cuda.backend import TorchCpuBackend  # noqa: E402
from fastdeploy.backends.cuda.quantized_linear import QuantizedWeight  # noqa: E402


@pytest.fixture
def backend(monkeypatch):
    from fastdeploy.backends.conformance import build_backend

    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    return build_backend("torch-cpu", threads=1)


@pytest.fixture(params=["torch-cpu", "paddle-cpu"])
def either_runtime(request, monkeypatch):
    """The backend on each tensor runtime (paddle tensors reach the interpreter through DLPack)."""
    from fastdeploy.backends.conformance import build_backend
    from fastdeploy.backends.cuda.runtimes import paddle_runtime

    if request.param == "paddle-cpu" and paddle_runtime.paddle_unavailable_reason() is not None:
        pytest.skip(f"paddle: {paddle_runtime.paddle_unavailable_reason()}")
    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    return build_backend(request.param, threads=1)


def test_the_cuda_backends_declare_quantized_weights():
    assert TorchCpuBackend.supports(Capability.QUANTIZED_WEIGHTS)


def test_fused_parts_stay_packed_and_multiply(either_runtime):
    """q, k and v parts (wint4) and GGUF Q4_0 / Q8_0 parts become one packed weight each."""
    ops = either_runtime
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 128)).astype(np.float32)
    parts = [(rng.standard_normal((rows, 128)) * 0.1).astype(np.float32) for rows in (64, 32, 32)]
    packed = [quantize_wint4(part, 64) for part in parts]
    weight = ops.linear_weight(*packed)
    assert isinstance(weight, QuantizedWeight) and weight.format == "wint4" and weight.shape == (128, 128)
    expected = np.concatenate([wint4_reference(p.qweight, p.scales, 64) for p in packed])
    out = ops.to_numpy(ops.linear(ops.from_numpy(x), weight))
    np.testing.assert_allclose(out, x.astype(np.float64) @ expected.T, rtol=1e-4, atol=1e-4)
    for type_name in ("Q4_0", "Q8_0"):
        qtype = GGMLQuantizationType[type_name]
        blocks = [GGMLTensor(int(qtype), quantize(part, qtype), part.shape) for part in parts]
        weight = ops.linear_weight(*blocks)
        assert isinstance(weight, QuantizedWeight) and weight.format == type_name
        expected = np.concatenate([dequantize(b.rows, qtype).reshape(b.shape) for b in blocks])
        bias = rng.standard_normal(128).astype(np.float32)
        out = ops.to_numpy(ops.linear(ops.from_numpy(x), weight, ops.linear_bias(bias)))
        np.testing.assert_allclose(out, x.astype(np.float64) @ expected.T + bias, rtol=1e-4, atol=1e-4)


def test_a_gguf_type_without_a_kernel_is_dequantised(backend):
    qtype = GGMLQuantizationType.Q5_0
    matrix = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    weight = backend.linear_weight(GGMLTensor(int(qtype), quantize(matrix, qtype), matrix.shape))
    assert not isinstance(weight, QuantizedWeight)
    np.testing.assert_allclose(
        backend.to_numpy(weight), dequantize(quantize(matrix, qtype), qtype).reshape(32, 64).T
    )


def _quantised_reference(weights, quantization, group):
    """tiny_llama's weights as the quantised model must see them: projections in `quantization`,
    the tied embedding (the head) in wint8 (float under fp8), dequantised by the documented
    formulas."""
    out = {}
    for name, value in weights.items():
        head = name == "model.embed_tokens.weight"
        if (head and quantization != "fp8") or (name.endswith("_proj.weight") and quantization == "wint8"):
            packed = quantize_wint8(value)
            out[name] = wint8_reference(packed.qweight, packed.scales)
        elif name.endswith("_proj.weight") and quantization == "wint4":
            packed = quantize_wint4(value, group)
            out[name] = wint4_reference(packed.qweight, packed.scales, group)
        elif name.endswith("_proj.weight"):
            packed = quantize_fp8(value)
            out[name] = fp8_reference(packed.qweight, packed.scales)
        else:
            out[name] = value
    return out


@pytest.mark.parametrize("quantization", ["wint8", "wint4", "fp8"])
def test_quantised_model_generates_the_reference_tokens(tmp_path, monkeypatch, quantization):
    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    config, weights = tiny_llama(str(tmp_path))
    prompt = [72, 101, 108, 108, 111, 44, 32]
    llm = LLM(
        model=str(tmp_path),
        device="torch-cpu",
        quantization=quantization,
        quantization_group_size=64,
        max_model_len=64,
        block_size=4,
        enforce_eager=True,
    )
    summary = llm.llm_engine.backend.loaded_weights_summary()  # what the load logs
    assert summary.startswith("linear weights on torch-cpu") and f"{quantization} " in summary
    # every linear layer, the head included, is packed; under fp8 the head and the fused qkv
    # (k and v hold 32 rows, not whole 128-row blocks) are float
    assert ("float32" in summary) == (quantization == "fp8")
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    (output,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    quantised = _quantised_reference(weights, quantization, 64)
    expected = ref.greedy_tokens(lambda ids: ref.llama_logits(quantised, config, ids), prompt, 6)
    assert list(output.outputs[0].token_ids) == expected


def test_wint4_refuses_a_group_size_that_does_not_divide_an_input_width(tmp_path, monkeypatch):
    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    tiny_llama(str(tmp_path))  # hidden 64
    with pytest.raises(
        InvalidArgumentError, match=r"quantization_group_size=128 .* hidden_size = 64.*supported: "
    ):
        LLM(model=str(tmp_path), device="torch-cpu", quantization="wint4")


@pytest.mark.parametrize(("name", "value"), [("quantization", "int3"), ("quantization_group_size", 32)])
def test_unknown_values_are_refused_with_the_supported_list(name, value):
    expected = "wint8, wint4, fp8" if name == "quantization" else "64, 128"
    with pytest.raises(InvalidArgumentError, match=f"{name} must be one of {expected}"):
        LLM(model="/nonexistent", **{name: value})


def test_fp8_is_refused_on_a_gpu_without_fp8_tensor_cores(backend, monkeypatch):
    monkeypatch.setattr(backend.rt, "compute_capability", lambda: (8, 0))
    with pytest.raises(InvalidArgumentError, match=r"FP8 tensor cores.*sm_80.*runs: wint8, wint4$"):
        check_backend_quantization("fp8", backend)
    monkeypatch.setattr(backend.rt, "compute_capability", lambda: (9, 0))
    check_backend_quantization("fp8", backend)
    assert backend.supported_quantizations() == ("wint8", "wint4", "fp8")


QUANTISERS = {"wint8": quantize_wint8, "wint4": lambda m: quantize_wint4(m, 64), "fp8": quantize_fp8}


@pytest.mark.parametrize("kind", ["wint8", "wint4", "fp8"])
@pytest.mark.parametrize("tokens", [3, 40])
def test_quantised_experts_stay_packed_in_the_fused_moe(backend, kind, tokens):
    """ERNIE-4.5 MoE's calls with wint8 / wint4 / block-FP8 experts, against float64 over the
    dequantised experts (decode-sized and prefill-sized tiles; FP8 with two 128-blocks of hidden
    and a second block of outputs in the fused gate/up)."""
    experts, top_k = 6, 2
    hidden, width = (256, 128) if kind == "fp8" else (128, 64)
    rng = np.random.default_rng(tokens)
    quantise = QUANTISERS[kind]
    dense = {
        part: [(rng.standard_normal(shape) * 0.2).astype(np.float32) for _ in range(experts)]
        for part, shape in (("gate", (width, hidden)), ("up", (width, hidden)), ("down", (hidden, width)))
    }
    packed = {part: [quantise(m) for m in mats] for part, mats in dense.items()}
    stacked = backend.moe_expert_weights(packed["gate"], packed["up"], packed["down"])
    assert stacked.gate_up_scales is not None and backend.weight_bytes[kind] > 0
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids = rng.integers(0, experts, (tokens, top_k)).astype(np.int32)
    weights = rng.random((tokens, top_k)).astype(np.float32)
    out = backend.to_numpy(
        backend.moe_experts(
            backend.from_numpy(x), stacked, backend.from_numpy(weights), backend.from_numpy(ids)
        )
    )

    def reference(p):
        if kind == "fp8":
            return fp8_reference(p.qweight, p.scales)
        return (
            wint8_reference(p.qweight, p.scales)
            if kind == "wint8"
            else wint4_reference(p.qweight, p.scales, 64)
        )

    expected = np.zeros((tokens, hidden))
    for t in range(tokens):
        for k in range(top_k):
            e = ids[t, k]
            gate = reference(packed["gate"][e]) @ x[t]
            up = reference(packed["up"][e]) @ x[t]
            expected[t] += weights[t, k] * (reference(packed["down"][e]) @ (gate / (1 + np.exp(-gate)) * up))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_fp8_experts_without_whole_blocks_of_gate_rows_are_dequantised(backend, monkeypatch):
    """A fused gate/up whose gate rows end mid-block cannot keep FP8's 128 x 128 blocks, and an
    older GPU has no e4m3: the experts then run in the compute dtype (no fp8 bytes counted)."""
    rng = np.random.default_rng(3)
    ragged = [quantize_fp8(rng.standard_normal((64, 128)).astype(np.float32)) for _ in range(2)]
    down = [quantize_fp8(rng.standard_normal((128, 64)).astype(np.float32)) for _ in range(2)]
    assert backend.moe_expert_weights(ragged, ragged, down).gate_up_scales is None
    whole = [quantize_fp8(rng.standard_normal((128, 128)).astype(np.float32)) for _ in range(2)]
    monkeypatch.setattr(backend.rt, "compute_capability", lambda: (8, 0))
    assert backend.moe_expert_weights(whole, whole, whole).gate_up_scales is None
    assert backend.weight_bytes.get("fp8", 0) == 0


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_k_quant_matrices_stay_in_their_super_blocks(backend, type_name):
    qtype = GGMLQuantizationType[type_name]
    rng = np.random.default_rng(7)
    # gguf cannot make K-quants: start from bytes, with small float16 factors where they sit
    blocks = rng.integers(0, 256, (48, 144 if type_name == "Q4_K" else 210), dtype=np.uint8)
    for offset in (0, 2) if type_name == "Q4_K" else (208,):
        blocks[:, offset : offset + 2] = np.full(48, 2.0**-8, np.float16).view(np.uint8).reshape(-1, 2)
    weight = backend.linear_weight(GGMLTensor(int(qtype), blocks, (48, 256)))
    assert isinstance(weight, QuantizedWeight) and weight.format == type_name
    x = rng.standard_normal((2, 256)).astype(np.float32)
    expected = x.astype(np.float64) @ dequantize(blocks, qtype).reshape(48, 256).T.astype(np.float64)
    out = backend.to_numpy(backend.linear(backend.from_numpy(x), weight))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def _write_fp8_checkpoint(directory, config, weights):
    """tiny_llama as a block-FP8 checkpoint (DeepSeek-V3 / Qwen3-FP8 layout): each projection's
    e4m3 `weight` (safetensors F8_E4M3) and float32 `weight_scale_inv`, the rest float32, and
    config.json's quantization_config; written byte by byte (safetensors' numpy API has no e4m3)."""
    import json
    import os
    import struct

    stored = {}
    for name, value in weights.items():
        if name.endswith("_proj.weight"):
            packed = quantize_fp8(value)
            stored[name] = ("F8_E4M3", packed.qweight)
            stored[name.replace(".weight", ".weight_scale_inv")] = ("F32", packed.scales)
        else:
            stored[name] = ("F32", np.ascontiguousarray(value, np.float32))
    header, offset, chunks = {}, 0, []
    for name, (dtype, array) in sorted(stored.items(), reverse=True):  # scales before their weights
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        chunks.append(data)
    text = json.dumps(header).encode()
    with open(os.path.join(directory, "model.safetensors"), "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    config = dict(config, quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)


@pytest.mark.parametrize("device", ["torch-cpu", "cpu"])
def test_an_fp8_checkpoint_loads_without_a_float_copy(tmp_path, monkeypatch, device):
    """On torch-cpu (Triton) the e4m3 projections stay packed; the cpu backend dequantises them."""
    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    config, weights = tiny_llama(str(tmp_path))
    _write_fp8_checkpoint(str(tmp_path), config, weights)
    llm = LLM(model=str(tmp_path), device=device, max_model_len=64, block_size=4, enforce_eager=True)
    if device == "torch-cpu":
        assert "fp8 " in llm.llm_engine.backend.loaded_weights_summary()
    prompt = [72, 101, 108, 108, 111, 44, 32]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    (output,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    seen = _quantised_reference(weights, "fp8", 0)
    expected = ref.greedy_tokens(lambda ids: ref.llama_logits(seen, config, ids), prompt, 6)
    assert list(output.outputs[0].token_ids) == expected
