"""GPT-OSS against transformers' `GptOssForCausalLM` in float32: greedy tokens of tiny random
checkpoints (tests/models/tiny_gpt_oss.py), float experts and MXFP4 experts (transformers runs the
dequantised weights). The prompts stay within the 64-token sliding window, except in the test
that narrows it to 8.
"""

from __future__ import annotations

import os

import pytest
import tiny_checkpoints as tiny
from kv_group_peaks import held_now, track_peaks

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.cuda.backend import CudaBackend

# the Triton kernels run interpreted on the host (read when a kernel module is first imported)
os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_gpt_oss import (  # noqa: E402  (needs torch and transformers)
    CONFIG,
    NEW_TOKENS,
    PROMPTS,
    mxfp4_tensors,
    reference_model,
    reference_tokens,
    write_checkpoint,
)


def engine_tokens(directory: str, **kwargs) -> list[list[int]]:
    return generate(LLM(model=directory, **{"max_model_len": 64, **kwargs}))


def generate(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for output in outputs:
        assert output.error_code == 200, output.error_msg
    return [list(output.outputs.token_ids) for output in outputs]


@pytest.fixture(scope="module")
def float_tokens() -> list[list[int]]:
    """transformers' tokens on the checkpoint as seeded (shared: each run takes seconds)."""
    return reference_tokens(reference_model())


def test_float_checkpoint_matches_transformers(tmp_path, float_tokens):
    model = reference_model()
    tensors = {name: t.numpy() for name, t in model.state_dict().items()}
    directory = write_checkpoint(tmp_path / "float", tensors)
    assert engine_tokens(directory) == float_tokens


def test_mxfp4_checkpoint_matches_transformers_on_the_dequantised_weights(tmp_path):
    model = reference_model()
    directory = write_checkpoint(tmp_path / "mxfp4", mxfp4_tensors(model))
    assert engine_tokens(directory) == reference_tokens(model)


@pytest.fixture(scope="module")
def narrow_window(tmp_path_factory) -> tuple[str, list[list[int]]]:
    """The checkpoint with a window of 8 and transformers' tokens for it."""
    model = reference_model(sliding_window=8)
    tensors = {name: t.numpy() for name, t in model.state_dict().items()}
    directory = write_checkpoint(tmp_path_factory.mktemp("window"), tensors, sliding_window=8)
    return directory, reference_tokens(model)


def test_past_the_sliding_window_the_sliding_layer_attends_over_its_window(
    narrow_window, float_tokens, monkeypatch
):
    """A window of 8: every prompt and its 24 tokens cross it (the sliding layer forgets, the full
    layer does not), and the tokens still equal transformers'; narrowing the window changes
    transformers' tokens, so the window is exercised."""
    directory, expected = narrow_window
    assert expected != float_tokens
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


def test_the_sliding_layer_keeps_only_its_window_of_blocks(narrow_window):
    """A window of 8 over 4-position blocks: the sliding layer's KV group holds the window, a
    prefill chunk and a margin while the full layer's keeps every position, in a cache too small
    for both layers to hold the 37 positions of the longer prompt and its tokens (the two prompts
    take turns: one is preempted); tokens are transformers', and every block comes back."""
    directory, expected = narrow_window
    longest = max(len(prompt) for prompt in PROMPTS) + NEW_TOKENS
    layer_position = 2 * CONFIG["num_key_value_heads"] * CONFIG["head_dim"] * 4  # float32 key and value
    budget = 72 * layer_position  # the full layer's 40 (max_model_len) and the sliding layer's 8 + 8 + 12
    assert budget < 2 * longest * layer_position
    llm = LLM(
        model=directory, max_model_len=40, block_size=4, max_num_batched_tokens=8, kv_cache_memory=budget
    )
    peaks = track_peaks(llm)
    assert generate(llm) == expected
    full, sliding = peaks
    assert full == -(-(longest - 1) // 4)  # every position but the last token's (never fed back)
    assert sliding <= 8 // 4 + 8 // 4 + 3
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert held_now(llm) == [0, 0]


def test_the_checkpoint_exercises_sinks_and_the_clamp(float_tokens):
    """Without its sinks, or without the clamp, transformers' tokens change: the equalities above
    cover both features."""
    model = reference_model()
    sinks = [layer.self_attn.sinks.detach().clone() for layer in model.model.layers]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
        assert reference_tokens(model) != float_tokens
        for layer, saved in zip(model.model.layers, sinks, strict=True):
            layer.self_attn.sinks.copy_(saved)
            layer.mlp.experts.limit = 1e9
    assert reference_tokens(model) != float_tokens


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
