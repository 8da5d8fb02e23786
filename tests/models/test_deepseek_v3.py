"""DeepSeek-V3 (multi-head latent attention, grouped-routed experts) against transformers' float32
greedy tokens on tiny random checkpoints (tests/models/tiny_deepseek.py), its latent KV cache,
both attention paths against plain multi-head attention, and its config errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny_deepseek as deepseek

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.base import BackendOptions, BatchLayout, KVCacheSpec
from fastdeploy.backends.cpu import latent_attention
from fastdeploy.backends.cpu.attention import build_metadata
from fastdeploy.backends.cpu.latent_attention import absorbed_attention, absorbs, expanded_attention
from fastdeploy.backends.cpu.native import attention_batch
from fastdeploy.backends.cuda.backend import CudaBackend
from fastdeploy.backends.cuda.cuda_graphs import DecodeGraphs
from fastdeploy.backends.selection import create_backend
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.model_executor.model_loader import build_model, inspect_checkpoint
from fastdeploy.models.grouped_moe import grouped_topk
from fastdeploy.plugins.registry import get_registry

# the cuda backend's Triton kernels run on the host in Triton's interpreter, which `triton.jit`
# reads when the kernel modules are imported
os.environ.setdefault("TRITON_INTERPRET", "1")
# the fake CUDA graph of the cuda backend's tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    dirs = {}
    for name in deepseek.SPECS:
        directory = tmp_path_factory.mktemp(name)
        deepseek.write_checkpoint(directory, name)
        dirs[name] = str(directory)
    return dirs


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, list[list[int]]]:
    pytest.importorskip("transformers", reason="the reference tokens come from transformers")
    out = {}
    for name in deepseek.SPECS:
        directory = tmp_path_factory.mktemp(f"{name}-hf")
        deepseek.write_checkpoint(directory, name, mtp=False)
        out[name] = deepseek.transformers_greedy(directory, deepseek.PROMPTS)
    return out


def _full_attention(q_nope, q_rope, latent, k_rope, absorb_k, absorb_v, scale, first_position):
    """Plain multi-head attention with every head's keys and values formed explicitly (the
    DeepSeek-V2 paper's equations before any absorption): queries at positions
    first_position.. over keys 0..; [L, heads, v_dim]."""
    keys_nope = np.einsum("cl,hnl->chn", latent, absorb_k)
    values = np.einsum("cl,hvl->chv", latent, absorb_v)
    out = np.zeros((q_nope.shape[0], q_nope.shape[1], absorb_v.shape[1]))
    for i in range(q_nope.shape[0]):
        visible = first_position + i + 1
        for h in range(q_nope.shape[1]):
            scores = keys_nope[:visible, h] @ q_nope[i, h] + k_rope[:visible] @ q_rope[i, h]
            probs = np.exp((scores - scores.max()) * scale)
            probs /= probs.sum()
            out[i, h] = probs @ values[:visible, h]
    return out


@pytest.mark.parametrize("path", [absorbed_attention, expanded_attention], ids=lambda f: f.__name__)
@pytest.mark.parametrize(("length", "context"), [(7, 7), (3, 9), (1, 9)], ids=["prefill", "verify", "decode"])
def test_both_latent_attention_paths_equal_full_attention(path, length, context):
    """The absorbed and the expanded path each give what attention over explicit per-head keys
    and values gives, for the last `length` positions of a context."""
    rng = np.random.default_rng(length)
    heads, nope, rope, lora, v_dim = 3, 8, 4, 6, 5
    absorb_k = rng.standard_normal((heads, nope, lora)).astype(np.float32)
    absorb_v = rng.standard_normal((heads, v_dim, lora)).astype(np.float32)
    q_nope = rng.standard_normal((length, heads, nope)).astype(np.float32)
    q_rope = rng.standard_normal((length, heads, rope)).astype(np.float32)
    latent = rng.standard_normal((context, lora)).astype(np.float32)
    k_rope = rng.standard_normal((context, rope)).astype(np.float32)
    expected = _full_attention(q_nope, q_rope, latent, k_rope, absorb_k, absorb_v, 0.3, context - length)
    got = path(q_nope, q_rope, latent, k_rope, absorb_k, absorb_v, 0.3)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_decode_absorbs_and_a_prompt_expands_at_deepseek_v3_dims():
    assert absorbs(1, lora=512, rope=64, nope=128, v_dim=128)
    assert absorbs(4, lora=512, rope=64, nope=128, v_dim=128)  # a verify pass of 3 drafts
    assert not absorbs(1024, lora=512, rope=64, nope=128, v_dim=128)


@pytest.mark.parametrize("metadata", ["numpy", "native"])
def test_latent_attention_prefill_and_decode_paths_equal_full_attention(metadata):
    """The backend op: a 7-token prefill then one decode step, in blocks of 4 out of order,
    against attention over explicit per-head keys and values."""
    rng = np.random.default_rng(0)
    heads, nope, rope, lora, v_dim, length, block = 3, 8, 4, 6, 5, 8, 4
    absorb_k = rng.standard_normal((heads, nope, lora)).astype(np.float32)
    absorb_v = rng.standard_normal((heads, v_dim, lora)).astype(np.float32)
    q_nope = rng.standard_normal((length, heads, nope)).astype(np.float32)
    q_rope = rng.standard_normal((length, heads, rope)).astype(np.float32)
    latent = rng.standard_normal((length, lora)).astype(np.float32)
    k_rope = rng.standard_normal((length, rope)).astype(np.float32)
    scale = 0.3
    backend = create_backend("cpu", BackendOptions(threads=1), get_registry())
    cache = backend.allocate_kv_cache(KVCacheSpec(1, 3, block, 1, lora + rope, kind="latent"))[0]
    table = np.array([[2, 0]])  # out of order: slots come from the block table
    expected = _full_attention(q_nope, q_rope, latent, k_rope, absorb_k, absorb_v, scale, 0)
    prepare = build_metadata if metadata == "numpy" else attention_batch
    for start, end in ((0, 7), (7, 8)):
        positions = np.arange(start, end)
        layout = BatchLayout(
            input_ids=np.zeros(end - start, np.int64),
            positions=positions,
            slot_mapping=table[0, positions // block] * block + positions % block,
            query_lens=np.array([end - start]),
            context_lens=np.array([end]),
            block_tables=table,
            logits_indices=np.array([end - start - 1]),
            block_size=block,
        )
        got = backend.latent_attention(
            q_nope[start:end],
            q_rope[start:end],
            latent[start:end],
            k_rope[start:end],
            cache,
            prepare(layout),
            absorb_k,
            absorb_v,
            scale,
        )
        np.testing.assert_allclose(got, expected[start:end], rtol=1e-4, atol=1e-5)


def test_latent_cache_holds_one_vector_per_token(checkpoints):
    """The KV cache stores kv_lora_rank + qk_rope_head_dim floats per token and layer, not
    keys and values per head."""
    config = deepseek.SPECS["v3"]["config"]
    registry = get_registry()
    backend = create_backend("cpu", BackendOptions(threads=1), registry)
    model = build_model(inspect_checkpoint(checkpoints["v3"], registry), backend, 64, registry)
    spec = model.kv_cache_spec(4, 16, "float32")
    width = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    assert (spec.kind, spec.num_kv_heads, spec.head_dim) == ("latent", 1, width)
    assert spec.bytes_per_position() == config["num_hidden_layers"] * width * 4
    full_kv = (
        config["num_hidden_layers"]
        * 2
        * config["num_attention_heads"]
        * (config["qk_nope_head_dim"] + config["qk_rope_head_dim"])
        * 4
    )
    assert spec.bytes_per_position() < full_kv / 5
    caches = backend.allocate_kv_cache(spec)
    assert [c.latent.shape for c in caches] == [(64, width)] * config["num_hidden_layers"]


def test_grouped_routing_against_hand_computed_choices():
    """8 experts in 4 groups of 2, the best 2 groups compete, top 2 experts: the correction bias
    chooses groups and experts, the unbiased scores weigh them."""
    scores = np.array([[0.9, 0.35, 0.6, 0.1, 0.92, 0.05, 0.3, 0.3]])
    logits = np.log(scores / (1 - scores)).astype(np.float32)  # sigmoid(logits) = scores
    bias = np.array([0, 0, 0, 0, 0, 0, 0.7, 0], np.float32)
    # group sums of the two best biased scores: 1.25, 0.7, 0.97, 1.3 -> groups 3 and 0; expert 4
    # (0.92) is out with its group although it beats expert 0
    weights, ids = grouped_topk(logits, bias, 2, 4, 2, normalize=True, scaling=2.0)
    assert ids[0].tolist() == [6, 0]
    np.testing.assert_allclose(weights[0], [2 * 0.3 / 1.2, 2 * 0.9 / 1.2], rtol=1e-5)
    weights, ids = grouped_topk(logits, bias, 2, 1, 1, normalize=False, scaling=1.0)
    assert ids[0].tolist() == [6, 4]
    np.testing.assert_allclose(weights[0], [0.3, 0.92], rtol=1e-5)


@pytest.mark.parametrize("path", ["absorbed", "expanded"])
@pytest.mark.parametrize("name", list(deepseek.SPECS))
def test_greedy_tokens_equal_transformers(name, path, checkpoints, references, monkeypatch):
    """With every sequence's attention forced through one path (prompts, decode steps alike)."""
    monkeypatch.setattr(latent_attention, "absorbs", lambda *args: path == "absorbed")
    llm = LLM(model=checkpoints[name], max_model_len=deepseek.MAX_MODEL_LEN, block_size=16)
    params = SamplingParams(temperature=0, max_tokens=deepseek.NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in deepseek.PROMPTS], params, use_tqdm=False)
    assert [o.outputs.token_ids for o in outputs] == references[name]


@pytest.mark.parametrize(
    ("device", "kernels", "names", "new_tokens"),
    [
        ("torch-cpu", "reference", list(deepseek.SPECS), deepseek.NEW_TOKENS),
        # the interpreted Triton kernels take ~3 s a step here: a few tokens of the "v3" shape
        ("torch-cpu", "triton", ["v3"], 5),
        # paddle's runtime (FastDeploy's choice on a GPU when paddlepaddle-gpu is installed)
        ("paddle-cpu", "reference", list(deepseek.SPECS), deepseek.NEW_TOKENS),
        # compiled, with the decode steps in real CUDA graphs
        pytest.param("cuda", "triton", list(deepseek.SPECS), deepseek.NEW_TOKENS, marks=pytest.mark.gpu),
    ],
)
def test_the_cuda_backends_code_gives_transformers_tokens(
    device, kernels, names, new_tokens, checkpoints, references, monkeypatch
):
    """The cuda backend's code: absorbed decode over the paged latents, expanded prefill, in
    prompts cut into 32-token chunks (the long one's later chunks attend over cached latents),
    then the long prompt again from the prefix cache."""
    if device == "cuda":
        reason = CudaBackend.unavailable_reason()
        if reason is not None:
            pytest.skip(f"no usable NVIDIA GPU: {reason}")
    if device == "paddle-cpu":
        pytest.importorskip("paddle", reason="the paddle-cpu backend needs paddlepaddle")
    else:
        pytest.importorskip("torch", reason="the cuda backend's code here runs on torch")
    if kernels == "triton":
        pytest.importorskip("triton", reason="the Triton kernels need triton (the test extra installs it)")
    monkeypatch.setenv("FD_CUDA_KERNELS", kernels)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in deepseek.PROMPTS]
    for name in names:
        llm = LLM(
            model=checkpoints[name],
            device=device,
            dtype="float32",
            max_model_len=deepseek.MAX_MODEL_LEN,
            block_size=16,
            max_num_batched_tokens=32,
        )
        expected = [tokens[:new_tokens] for tokens in references[name]]
        assert [o.outputs.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == expected
        (again,) = llm.generate([prompts[2]], params, use_tqdm=False)
        assert again.num_cached_tokens >= 64
        assert again.outputs.token_ids == expected[2]


def test_decode_graph_replays_give_transformers_tokens(checkpoints, references, monkeypatch):
    """Decode steps replayed from captured graphs (a fake graph re-runs the captured closure into
    its kept outputs, `device_doubles.FakeGraph`): the absorbed decode reads only the static
    buffers, with three sequences in the bucket of four (a padded row: slot -1, context 0)."""
    pytest.importorskip("torch", reason="the torch-cpu backend needs torch")
    pytest.importorskip("triton", reason="the Triton kernels need triton (the test extra installs it)")
    from device_doubles import FakeGraph

    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    llm = LLM(
        model=checkpoints["v3"],
        device="torch-cpu",
        dtype="float32",
        max_model_len=deepseek.MAX_MODEL_LEN,
        block_size=16,
        max_num_seqs=4,
    )
    runner = llm.llm_engine.runner
    graphs = DecodeGraphs(
        llm.llm_engine.backend,
        runner.model,
        runner.kv_caches,
        16,
        4,
        deepseek.MAX_MODEL_LEN,
        new_graph=FakeGraph,
    )
    graphs.capture()
    runner.graphs = graphs
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in deepseek.PROMPTS], params, use_tqdm=False)
    assert graphs.replays >= 3
    assert [o.outputs.token_ids for o in outputs] == [tokens[:4] for tokens in references["v3"]]


@pytest.mark.parametrize("field", ["kv_lora_rank", "qk_rope_head_dim", "n_group", "routed_scaling_factor"])
def test_a_missing_config_field_is_named(tmp_path, field):
    deepseek.write_checkpoint(tmp_path, "v3", **{field: None})
    with pytest.raises(InvalidArgumentError, match=field):
        LLM(model=str(tmp_path), max_model_len=32)


def test_an_int8_latent_cache_is_refused_naming_the_option(checkpoints):
    with pytest.raises(InvalidArgumentError, match="kv_cache_dtype='int8'"):
        LLM(model=checkpoints["v3"], max_model_len=32, kv_cache_dtype="int8")
