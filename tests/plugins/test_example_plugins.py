"""The example plugin packages, used the way a user would: pip-installed, found by entry point.

Nothing here imports `fastdeploy_gpt2` or `fastdeploy_think_parser`; the model and the parser
are reached through `LLM(model=...)` and `LLM(..., reasoning_parser=...)` only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from gpt2_checkpoint import gpt2_logits, weights_digest, write_gpt2
from token_match import assert_outputs_match, assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.conformance.checkpoint import write_byte_tokenizer, write_checkpoint
from fastdeploy.backends.conformance.numpy_reference import greedy_tokens

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "gpt2_tiny_reference.json")


@pytest.fixture(scope="module")
def gpt2_reference() -> dict:
    with open(FIXTURE, encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, example_plugins) -> tuple[str, dict[str, np.ndarray]]:
    directory = str(tmp_path_factory.mktemp("tiny-gpt2"))
    return directory, write_gpt2(directory)


def test_plugins_are_installed_distributions_with_entry_points(example_plugins):
    import importlib.metadata

    for distribution in example_plugins:
        entry_points = importlib.metadata.distribution(distribution).entry_points
        assert [ep.group for ep in entry_points] == ["fastdeploy.plugins"]


def test_checkpoint_is_the_one_the_transformers_fixture_was_made_from(gpt2_dir, gpt2_reference):
    assert weights_digest(gpt2_dir[1]) == gpt2_reference["metadata"]["weights_sha256"]


@pytest.mark.parametrize("device", ["cpu", "paddle-cpu"])
def test_gpt2_greedy_tokens_match_transformers_and_numpy(gpt2_dir, gpt2_reference, device):
    if device == "paddle-cpu":
        pytest.importorskip(
            "paddle", reason="the Paddle backend needs paddlepaddle (the test extra installs it)"
        )
    directory, weights = gpt2_dir
    llm = LLM(model=directory, device=device, max_model_len=128, block_size=8)
    assert llm.llm_engine.model_config.architecture == "GPT2LMHeadModel"
    cases = gpt2_reference["cases"]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=5)
    outputs = llm.generate(
        [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases], params, use_tqdm=False
    )
    assert_outputs_match(outputs, [c["output_token_ids"] for c in cases])
    numpy_tokens = [
        greedy_tokens(lambda ids: gpt2_logits(weights, ids), c["prompt_token_ids"], 16) for c in cases
    ]
    assert_tokens_match([o.outputs.token_ids for o in outputs], numpy_tokens)
    for case, output in zip(cases, outputs, strict=True):
        first = output.outputs.logprobs[0]
        for token, logprob in case["first_step_top5_logprobs"]:
            assert first[token] == pytest.approx(logprob, abs=1e-4)


def test_gpt2_checkpoint_without_transformer_prefix(tmp_path, example_plugins):
    """The original GPT-2 upload stores `h.0.attn...`; the plugin's loader accepts both."""
    weights = write_gpt2(str(tmp_path), prefixed=False)
    llm = LLM(model=str(tmp_path), device="cpu", max_model_len=64)
    prompt = list(b"abc")
    (output,) = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
        use_tqdm=False,
    )
    assert output.outputs.token_ids == greedy_tokens(lambda ids: gpt2_logits(weights, ids), prompt, 6)


def test_gpt2_text_in_text_out(gpt2_dir):
    """A text prompt goes through the byte-level tokenizer.json and back to text."""
    llm = LLM(model=gpt2_dir[0], device="cpu", max_model_len=64)
    (output,) = llm.generate(
        "Hi", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False
    )
    assert output.prompt_token_ids == list(b"Hi")
    expected = greedy_tokens(lambda ids: gpt2_logits(gpt2_dir[1], ids), list(b"Hi"), 4)
    assert output.outputs.token_ids == expected


# --- the reasoning-parser plugin ----------------------------------------------------------------
THINK, END_THINK = 257, 258
#: each token of the scripted answer and the token the model must produce after it
SCRIPT = {ord("?"): THINK, THINK: ord("h"), ord("h"): ord("m"), ord("m"): END_THINK}
SCRIPT |= {END_THINK: ord("\n"), ord("\n"): ord("o"), ord("o"): ord("k"), ord("k"): 256}


def write_scripted_llama(directory: str) -> None:
    """A Llama whose greedy continuation of "...?" is "<think>hm</think>\\nok" then EOS.

    Attention and MLP outputs are zero (o_proj and down_proj are zero), so the last hidden
    state is the normalised embedding of the current token: a one-hot direction per scripted
    token. The untied LM head maps that direction to the next token of the script.
    """
    write_byte_tokenizer(directory, extra_tokens=("<think>", "</think>"))
    hidden, vocab, layers = 16, 259, 1
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": 32,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "eos_token_id": 256,
    }
    embed, head = np.zeros((vocab, hidden), np.float32), np.zeros((vocab, hidden), np.float32)
    for dim, (token, following) in enumerate(SCRIPT.items()):
        embed[token, dim] = 1.0
        head[following, dim] = 1.0
    zeros = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    weights = {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": head,
        "model.norm.weight": np.ones(hidden, np.float32),
    }
    p = "model.layers.0."
    weights |= {
        p + "input_layernorm.weight": np.ones(hidden, np.float32),
        p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
    }
    weights |= {p + f"self_attn.{x}_proj.weight": zeros(hidden, hidden) for x in "qkvo"}
    weights |= {p + "mlp.gate_proj.weight": zeros(32, hidden), p + "mlp.up_proj.weight": zeros(32, hidden)}
    weights |= {p + "mlp.down_proj.weight": zeros(hidden, 32)}
    write_checkpoint(directory, config, weights)


def test_reasoning_parser_plugin_splits_llm_output(tmp_path, example_plugins):
    write_scripted_llama(str(tmp_path))
    plain = LLM(model=str(tmp_path), device="cpu", max_model_len=64)
    (raw,) = plain.generate("Why?", SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    assert raw.outputs.text == "<think>hm</think>\nok" and raw.outputs.reasoning_content is None
    llm = LLM(model=str(tmp_path), device="cpu", max_model_len=64, reasoning_parser="think-tags")
    (output,) = llm.generate("Why?", SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    assert output.outputs.reasoning_content == "hm"
    assert output.outputs.text == "ok"
    assert output.outputs.finish_reason == "stop"


def test_plugins_work_in_a_fresh_interpreter_without_imports(gpt2_dir, tmp_path):
    """What a user does: `pip install` the plugin, then only `from fastdeploy import LLM`."""
    write_scripted_llama(str(tmp_path))
    script = (
        "import sys\n"
        "from fastdeploy import LLM, SamplingParams\n"
        f"llm = LLM(model={gpt2_dir[0]!r}, device='cpu', max_model_len=64)\n"
        "out = llm.generate({'prompt_token_ids': [72, 105]}, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)\n"
        "print(llm.llm_engine.model_config.architecture, out[0].outputs.token_ids)\n"
        f"llm = LLM(model={str(tmp_path)!r}, device='cpu', max_model_len=64, reasoning_parser='think-tags')\n"
        "out = llm.generate('Why?', SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0].outputs\n"
        "print(repr(out.reasoning_content), repr(out.text))\n"
        "print(sorted(m for m in sys.modules if m.startswith('fastdeploy_')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    expected = greedy_tokens(lambda ids: gpt2_logits(gpt2_dir[1], ids), [72, 105], 3)
    assert lines[0] == f"GPT2LMHeadModel {expected}"
    assert lines[1] == "'hm' 'ok'"
    # the registry imported the plugins through their entry points
    assert "fastdeploy_gpt2" in lines[2] and "fastdeploy_think_parser" in lines[2]


@pytest.mark.parametrize(
    ("text", "reasoning", "answer"),
    [
        ("<think>\nstep 1\nstep 2\n</think>\n\nParis.", "step 1\nstep 2", "Paris."),
        ("Paris.", None, "Paris."),
        ("  <think>unfinished", "unfinished", ""),
        ("The tag <think> comes later", None, "The tag <think> comes later"),
    ],
)
def test_think_tags_parser_cases_and_streaming_prefixes(
    example_plugins, fresh_registry, text, reasoning, answer
):
    """Found by name through the registry; every streamed split extends the previous one."""
    parser = fresh_registry.get_registry().reasoning_parsers()["think-tags"](tokenizer=None)
    final = parser.split(text, thinking_enabled=True, finished=True)
    assert (final.reasoning_content, final.content) == (reasoning, answer)
    previous = ("", "")
    for end in range(len(text) + 1):
        split = parser.split(text[:end], thinking_enabled=True, finished=end == len(text))
        current = (split.reasoning_content or "", split.content)
        assert current[0].startswith(previous[0]) and current[1].startswith(previous[1]), text[:end]
        previous = current
