"""ERNIE-4.5 (dense, MoE), Qwen2, Qwen3 and Llama against transformers' implementations.

Each tiny random-weight model (tests/models/tiny_checkpoints.py) is written by the test in the
`-PT` layout and, for ERNIE, in the `-Paddle` layout (one of each sharded with an index). The
references come from transformers through tools/make_model_references.py and are committed in
tests/fixtures/tiny_model_references.json; these tests need neither torch nor transformers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny_checkpoints as tiny
from token_match import assert_outputs_match, assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.selection import create_backend
from fastdeploy.model_executor.model_loader import build_model, inspect_checkpoint
from fastdeploy.plugins.registry import get_registry

#: float32 tolerance for logits of magnitude ~10 after a few layers
ATOL = 1e-4

#: (model, layout, shards): every architecture as -PT; ERNIE also as -Paddle; one of each sharded
VARIANTS = [
    ("ernie4_5", "pt", 1),
    ("ernie4_5", "paddle", 2),
    ("ernie4_5_moe", "pt", 3),
    ("ernie4_5_moe", "paddle", 1),
    ("qwen2", "pt", 1),
    ("qwen3", "pt", 2),
    ("llama", "pt", 1),
]
PARSERS = {
    "ernie4_5": "ernie-45-vl",
    "ernie4_5_moe": "ernie-x1",
    "qwen2": None,
    "qwen3": "qwen3",
    "llama": None,
}


@pytest.fixture(scope="module")
def references() -> dict:
    return json.loads((tiny.FIXTURES / "tiny_model_references.json").read_text(encoding="utf-8"))["models"]


@pytest.fixture(scope="module")
def checkpoint_dirs(tmp_path_factory) -> dict[tuple[str, str, int], str]:
    dirs = {}
    for name, layout, shards in VARIANTS:
        directory = tmp_path_factory.mktemp(f"{name}-{layout}")
        tiny.write_checkpoint(directory, name, layout, shards)
        tiny.write_ernie_tokenizer(directory)
        dirs[(name, layout, shards)] = str(directory)
    return dirs


def teacher_forced_logits(model_dir: str, token_ids: list[int]) -> np.ndarray:
    """Logits of every position of `token_ids` from one prefill pass of our model (cpu backend)."""
    registry = get_registry()
    checkpoint = inspect_checkpoint(model_dir, registry)
    backend = create_backend("cpu", BackendOptions(threads=1), registry)
    model = build_model(checkpoint, backend, tiny.MAX_POSITIONS, registry)
    return tiny.prefill_logits(model, backend, token_ids)


def test_fixture_weights_are_the_ones_the_test_rebuilds(references):
    """A changed numpy random stream would make every comparison below meaningless."""
    for name, entry in references.items():
        assert entry["config"] == tiny.SPECS[name]["config"], name
        assert entry["weights_sha256"] == tiny.weights_checksum(tiny.pt_tensors(name)), (
            f"{name}: the seeded weights differ from those the fixture was made with; "
            "regenerate it with tools/make_model_references.py"
        )


def test_every_architecture_and_both_ernie_layouts_are_covered(references):
    assert set(references) == {"ernie4_5", "ernie4_5_moe", "qwen2", "qwen3", "llama"}
    assert {(name, layout) for name, layout, _ in VARIANTS} >= {
        ("ernie4_5", "paddle"),
        ("ernie4_5_moe", "paddle"),
    }


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}shard")
def test_logits_match_transformers(variant, checkpoint_dirs, references):
    name = variant[0]
    reference = references[name]
    for case in reference["cases"]:
        full = case["prompt_token_ids"] + case["output_token_ids"]
        logits = teacher_forced_logits(checkpoint_dirs[variant], full[:-1])
        prompt_len = len(case["prompt_token_ids"])
        if "prompt_logits" in case:
            np.testing.assert_allclose(
                logits[:prompt_len], np.asarray(case["prompt_logits"]), atol=ATOL, rtol=0
            )
        steps = logits[prompt_len - 1 :]
        np.testing.assert_allclose(steps, np.asarray(case["step_logits"]), atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}shard")
def test_llm_generates_the_reference_greedy_tokens(variant, checkpoint_dirs, references):
    name = variant[0]
    llm = LLM(model=checkpoint_dirs[variant], max_model_len=64, reasoning_parser=PARSERS[name])
    cases = references[name]["cases"]
    params = SamplingParams(temperature=0, max_tokens=tiny.NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(
        [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases], params, use_tqdm=False
    )
    assert_outputs_match(outputs, [c["output_token_ids"] for c in cases])


PADDLE_VARIANTS = [v for v in VARIANTS if v[1] == "paddle" or v[0].startswith("qwen")]


@pytest.mark.parametrize("variant", PADDLE_VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}")
def test_paddle_cpu_backend_generates_the_reference_greedy_tokens(variant, checkpoint_dirs, references):
    """The same models on the Paddle backend's CPU place, through the backend ops' portable
    defaults where it has no kernel of its own (the MoE routing and experts)."""
    backends = get_registry().device_backends()
    if "paddle-cpu" not in backends:
        pytest.skip("no paddle-cpu backend is registered")
    reason = backends["paddle-cpu"].unavailable_reason()
    if reason is not None:
        pytest.skip(f"paddle-cpu backend unavailable: {reason}")
    name = variant[0]
    llm = LLM(model=checkpoint_dirs[variant], max_model_len=64, device="paddle-cpu")
    cases = references[name]["cases"]
    params = SamplingParams(temperature=0, max_tokens=tiny.NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(
        [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases], params, use_tqdm=False
    )
    assert_tokens_match([o.outputs.token_ids for o in outputs], [c["output_token_ids"] for c in cases])
