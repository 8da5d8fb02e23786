"""GPT-OSS against transformers' `GptOssForCausalLM` in float32: greedy tokens of tiny random
checkpoints, float experts and MXFP4 experts (transformers runs the dequantised weights).

The checkpoint has the features that matter: attention sinks (some large, so heads attend to
little), q/k/v/o biases, a sliding and a full layer, YaRN rotary, routers with biases, experts
whose gate/up values pass the clamp (weights large enough), expert biases. The prompts stay
within the 64-token sliding window, except in the test that narrows it to 8.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import tiny_checkpoints as tiny
from kv_group_peaks import held_now, track_peaks
from safetensors.numpy import save_file

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.cuda.backend import CudaBackend

# the Triton kernels run interpreted on the host (read when a kernel module is first imported)
os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 24
PROMPTS = [[1, 17, 42, 99, 5, 63, 120], [3, 8, 150, 77, 21, 9, 44, 130, 11, 60, 7, 7, 31]]
CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "vocab_size": 160,
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 64,
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 64,
    },
    "attention_bias": True,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}
#: per-tensor-kind standard deviations: large enough for the clamp, the sinks and the router to matter
STD = {"experts.gate_up_proj": 1.5, "sinks": 2.0, "router": 1.0, "norm": 0.2, "bias": 0.3}


def _std(name: str) -> float:
    for key, std in STD.items():
        if key in name:
            return std
    return 0.3


def reference_model(**overrides):
    """transformers' model with seeded weights (norm weights around 1)."""
    fields = {k: v for k, v in (CONFIG | overrides).items() if k not in ("architectures", "model_type")}
    config = transformers.GptOssConfig(**fields)
    model = transformers.GptOssForCausalLM(config).eval()
    rng = np.random.default_rng(2907)
    with torch.no_grad():
        for name, parameter in sorted(model.state_dict().items()):
            values = rng.standard_normal(tuple(parameter.shape)) * _std(name)
            if name.endswith("norm.weight"):
                values += 1.0
            parameter.copy_(torch.from_numpy(values.astype(np.float32)))
    return model


def reference_tokens(model) -> list[list[int]]:
    """Greedy tokens, end-of-sequence included like any other (the engine runs with ignore_eos)."""
    outputs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = list(prompt)
            for _ in range(NEW_TOKENS):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            outputs.append(ids[len(prompt) :])
    return outputs


def write_checkpoint(directory: Path, tensors: dict[str, np.ndarray], **overrides) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: np.ascontiguousarray(t) for name, t in tensors.items()}, str(directory / "model.safetensors")
    )
    (directory / "config.json").write_text(json.dumps(CONFIG | overrides, indent=1), encoding="utf-8")
    tiny.write_ernie_tokenizer(directory)  # any tokenizer: the prompts are token ids
    return str(directory)


def engine_tokens(directory: str, **kwargs) -> list[list[int]]:
    return generate(LLM(model=directory, **{"max_model_len": 64, **kwargs}))


def generate(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for output in outputs:
        assert output.error_code == 200, output.error_msg
    return [list(output.outputs.token_ids) for output in outputs]


def to_mxfp4(matrix: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random MXFP4 [out, in/32, 16] blocks and [out, in/32] scales of a matrix's shape, and their
    float32 values (element 2j in the low nibble of byte j; value fp4 * 2^(scale - 127))."""
    e2m1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    out, depth = matrix.shape
    codes = rng.integers(0, 16, (out, depth // 32, 32), dtype=np.uint8)
    scales = rng.integers(124, 128, (out, depth // 32), dtype=np.uint8)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    values = (e2m1[codes] * np.exp2(scales.astype(np.float64) - 127)[..., None]).reshape(out, depth)
    return blocks, scales, values.astype(np.float32)


def test_float_checkpoint_matches_transformers(tmp_path):
    model = reference_model()
    tensors = {name: t.numpy() for name, t in model.state_dict().items()}
    directory = write_checkpoint(tmp_path / "float", tensors)
    assert engine_tokens(directory) == reference_tokens(model)


def test_mxfp4_checkpoint_matches_transformers_on_the_dequantised_weights(tmp_path):
    model = reference_model()
    rng = np.random.default_rng(11)
    tensors = {}
    with torch.no_grad():
        for name, parameter in model.state_dict().items():
            if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                tensors[name] = parameter.numpy()
                continue
            # transformers keeps [experts, in, out]; the checkpoint blocks are [experts, out, in/32, 16]
            parts = [to_mxfp4(expert.T, rng) for expert in parameter.numpy()]
            tensors[name + "_blocks"] = np.stack([blocks for blocks, _, _ in parts])
            tensors[name + "_scales"] = np.stack([scales for _, scales, _ in parts])
            parameter.copy_(torch.from_numpy(np.stack([values.T for _, _, values in parts])))
    directory = write_checkpoint(tmp_path / "mxfp4", tensors)
    assert engine_tokens(directory) == reference_tokens(model)


@pytest.fixture(scope="module")
def narrow_window(tmp_path_factory) -> tuple[str, list[list[int]]]:
    """The checkpoint with a window of 8 and transformers' tokens for it."""
    model = reference_model(sliding_window=8)
    tensors = {name: t.numpy() for name, t in model.state_dict().items()}
    directory = write_checkpoint(tmp_path_factory.mktemp("window"), tensors, sliding_window=8)
    return directory, reference_tokens(model)


def test_past_the_sliding_window_the_sliding_layer_attends_over_its_window(narrow_window, monkeypatch):
    """A window of 8: every prompt and its 24 tokens cross it (the sliding layer forgets, the full
    layer does not), and the tokens still equal transformers'; narrowing the window changes
    transformers' tokens, so the window is exercised."""
    directory, expected = narrow_window
    assert expected != reference_tokens(reference_model())
    assert engine_tokens(directory) == expected  # native kernels, sinks applied after
    monkeypatch.setenv("FD_CPU_KERNELS", "numpy")  # sinks and window inside the softmax
    assert engine_tokens(directory) == expected


@pytest.mark.parametrize(
    ("device", "kernels"),
    [
        ("torch-cpu", "triton"),
        ("paddle-cpu", "reference"),
        pytest.param("cuda", "triton", marks=pytest.mark.gpu),
    ],
)
def test_the_cuda_backends_code_runs_the_sinks_and_the_window(narrow_window, device, kernels, monkeypatch):
    """The cuda backend's kernels give transformers' tokens past the window: on the host its
    Triton kernels (interpreted: sinks and the window inside the prefill and split-KV decode
    kernels) and its reference kernels; compiled on a GPU where there is one."""
    if device == "cuda":
        reason = CudaBackend.unavailable_reason()
        if reason is not None:
            pytest.skip(f"no usable NVIDIA GPU: {reason}")
    else:
        pytest.importorskip(device.split("-")[0], reason=f"the {device} backend needs {device.split('-')[0]}")
    if kernels == "triton":
        pytest.importorskip("triton", reason="the Triton kernels need triton (the test extra installs it)")
    monkeypatch.setenv("FD_CUDA_KERNELS", kernels)
    directory, expected = narrow_window
    assert engine_tokens(directory, device=device, dtype="float32") == expected


def test_the_sliding_layer_keeps_only_its_window_of_blocks(tmp_path):
    """A window of 8 over 4-position blocks: the sliding layer's KV group holds the window, a
    prefill chunk and a margin while the full layer's keeps every position, in a cache too small
    for both layers to hold the 37 positions of the longer prompt and its tokens (the two prompts
    take turns: one is preempted); tokens are transformers', and every block comes back."""
    model = reference_model(sliding_window=8)
    tensors = {name: t.numpy() for name, t in model.state_dict().items()}
    directory = write_checkpoint(tmp_path / "window", tensors, sliding_window=8)
    longest = max(len(prompt) for prompt in PROMPTS) + NEW_TOKENS
    layer_position = 2 * CONFIG["num_key_value_heads"] * CONFIG["head_dim"] * 4  # float32 key and value
    budget = 72 * layer_position  # the full layer's 40 (max_model_len) and the sliding layer's 8 + 8 + 12
    assert budget < 2 * longest * layer_position
    llm = LLM(
        model=directory, max_model_len=40, block_size=4, max_num_batched_tokens=8, kv_cache_memory=budget
    )
    peaks = track_peaks(llm)
    assert generate(llm) == reference_tokens(model)
    full, sliding = peaks
    assert full == -(-(longest - 1) // 4)  # every position but the last token's (never fed back)
    assert sliding <= 8 // 4 + 8 // 4 + 3
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert held_now(llm) == [0, 0]


def test_the_checkpoint_exercises_sinks_and_the_clamp():
    """Without its sinks, or without the clamp, transformers' tokens change: the equalities above
    cover both features."""
    model = reference_model()
    tokens = reference_tokens(model)
    sinks = [layer.self_attn.sinks.detach().clone() for layer in model.model.layers]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
        assert reference_tokens(model) != tokens
        for layer, saved in zip(model.model.layers, sinks, strict=True):
            layer.self_attn.sinks.copy_(saved)
            layer.mlp.experts.limit = 1e9
    assert reference_tokens(model) != tokens


def test_chat_renders_the_harmony_prompt_and_the_gpt_oss_parser_reads_the_output(tmp_path):
    """A checkpoint without a chat template gets the harmony one; `reasoning_effort` reaches it."""
    overrides = {"vocab_size": tiny.CHAT_VOCAB_SIZE, "sliding_window": 256}
    model = reference_model(**overrides)
    tensors = {name: t.numpy() for name, t in model.state_dict().items()}
    directory = write_checkpoint(tmp_path / "chat", tensors, **overrides)
    tiny.write_ernie_tokenizer(directory, tokenizer_class="LlamaTokenizer")  # not ERNIE's template
    llm = LLM(model=directory, max_model_len=256, reasoning_parser="gpt-oss")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    (output,) = llm.chat(messages, params, chat_template_kwargs={"reasoning_effort": "low"}, use_tqdm=False)
    assert output.error_code == 200, output.error_msg
    assert output.prompt == (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\n\nReasoning: low\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
        "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    )
    assert len(output.outputs.token_ids) == 4 and output.outputs.tool_calls is None
