"""Gemma 2 beyond what every tiny family is checked for in test_tiny_families.py (there: first-step
logits and 24 greedy tokens against transformers' float32 eager attention, as a Hugging Face
directory and as llama.cpp's f32 GGUF, prompts and generations past the 20-position window):
that its soft-capping binds, its Q8_0 GGUF, what its GGUF config recovers, its refusals, and
the cuda backend's code running it.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tiny_checkpoints as tiny
import tiny_families as families

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.capabilities import Capability
from fastdeploy.backends.cuda.backend import CudaBackend
from fastdeploy.backends.selection import create_backend
from fastdeploy.errors import InvalidArgumentError, UnsupportedModelError
from fastdeploy.formats.gguf_file import read_gguf
from fastdeploy.input.family_templates import GEMMA_CHAT_TEMPLATE
from fastdeploy.model_executor.loaders.gguf_loader import config_from_gguf
from fastdeploy.model_executor.model_loader import build_model, inspect_checkpoint
from fastdeploy.plugins.registry import get_registry

SPEC = families.SPECS["gemma2"]["config"]
# the cuda backend's Triton kernels run interpreted on the host (read when a kernel module is first
# imported)
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(families.REFERENCES.read_text(encoding="utf-8"))["models"]["gemma2"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("gemma2")
    families.write_checkpoint(directory, "gemma2")
    tiny.write_ernie_tokenizer(directory)
    return str(directory)


def _cases(reference: dict) -> list[tuple[int, dict]]:
    return [(s["max_model_len"], case) for s in reference["prompt_sets"].values() for case in s["cases"]]


def test_the_attention_cap_binds(reference):
    """transformers' own tokens without the attention cap differ from its tokens with it in every
    case, so the engine's matching the capped ones (test_tiny_families) exercises the cap."""
    cases = _cases(reference)
    assert len(cases) == 3
    for _, case in cases:
        assert case["output_token_ids"] != case["output_token_ids_without_attention_softcap"]


def test_the_final_cap_bends_the_logits(reference):
    """The recorded first-step logits lie within +-final_logit_softcapping and reach well into
    tanh's bend (their largest is over half the cap), so the logits comparison checks it."""
    cap = SPEC["final_logit_softcapping"]
    for _, case in _cases(reference):
        logits = np.abs(case["first_logits"])
        assert logits.max() < cap and logits.max() > 0.5 * cap


def test_q8_0_gguf_generates_transformers_tokens_on_its_weights(reference):
    """llama.cpp's converter with --outtype q8_0: every matrix in Q8_0 blocks (the widths are
    multiples of 32), run in its blocks; the greedy tokens are transformers' float32 ones on the
    weights the file holds (`block_references`: Q8_0's rounding moves a greedy choice of this
    tiny model in the long prompt, 9 tokens in, so the float checkpoint's tokens are not it)."""
    params = SamplingParams(temperature=0, max_tokens=families.NEW_TOKENS, ignore_eos=True)
    expected = reference["block_references"]["q8_0"]
    for set_name, prompt_set in reference["prompt_sets"].items():
        llm = LLM(model=str(families.gguf_path("gemma2", "q8_0")), max_model_len=prompt_set["max_model_len"])
        prompts = [{"prompt_token_ids": case["prompt_token_ids"]} for case in prompt_set["cases"]]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert [output.outputs.token_ids for output in outputs] == expected[set_name]


def test_gguf_config_carries_the_caps_window_and_scale():
    config = config_from_gguf(read_gguf(families.gguf_path("gemma2")))
    for key in (
        "sliding_window",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "query_pre_attn_scalar",
        "head_dim",
        "tie_word_embeddings",
    ):
        assert config[key] == SPEC[key], key


def test_the_gguf_brings_its_tokenizer_and_gemmas_template():
    """llama.cpp writes no chat template for the tiny SentencePiece vocabulary: Gemma's turns."""
    tokenizer = LLM(model=str(families.gguf_path("gemma2")), max_model_len=32).get_tokenizer()
    assert tokenizer.chat_template == GEMMA_CHAT_TEMPLATE
    ids = tokenizer.encode("A river begins as rain.", add_special_tokens=False)
    assert tokenizer.decode(ids) == "A river begins as rain."


def test_every_other_layer_slides_and_every_layer_caps(hf_dir):
    registry = get_registry()
    backend = create_backend("cpu", BackendOptions(threads=1), registry)
    model = build_model(inspect_checkpoint(hf_dir, registry), backend, 64, registry)
    assert [layer.attention.window for layer in model.layers] == [20, 0, 20, 0]
    assert [layer.attention.softcap for layer in model.layers] == [3.0] * 4
    assert model.scale == 16**-0.5


def _reduced_backend(monkeypatch, capability: Capability):
    backend = create_backend("cpu", BackendOptions(threads=1), get_registry())
    monkeypatch.setattr(type(backend), "capabilities", type(backend).capabilities - {capability})
    return backend


def test_a_backend_without_soft_capping_refuses_it_by_name(hf_dir, monkeypatch):
    """Within the window as past it: capped scores differ at every length."""
    registry = get_registry()
    backend = _reduced_backend(monkeypatch, Capability.ATTENTION_SOFTCAP)
    checkpoint = inspect_checkpoint(hf_dir, registry)
    with pytest.raises(
        UnsupportedModelError, match=r"attn_logit_softcapping=3.*Capability.ATTENTION_SOFTCAP"
    ):
        build_model(checkpoint, backend, 16, registry)


@pytest.mark.parametrize("kernels", ["reference", "triton", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_cuda_backends_code_generates_transformers_tokens(reference, kernels, monkeypatch):
    """The cuda backend's code on the host (`torch-cpu`): soft-capped attention in its reference
    kernels and in its Triton kernels (interpreted), sliding past the window, and the logits
    capped on the device; every case's tokens are transformers'. "cuda": compiled on a GPU, with
    its CUDA graphs, where there is one."""
    device = "torch-cpu"
    if kernels == "cuda":
        reason = CudaBackend.unavailable_reason()
        if reason is not None:
            pytest.skip(f"no usable NVIDIA GPU: {reason}")
        device, kernels = "cuda", "triton"
    pytest.importorskip("torch", reason="the cuda backend's code needs torch here")
    if kernels == "triton":
        pytest.importorskip("triton", reason="the Triton kernels need triton (the test extra installs it)")
    monkeypatch.setenv("FD_CUDA_KERNELS", kernels)
    # interpreted, each decode step takes most of a second: 16 tokens still take the 7-token prompt's last
    # step to position 21, past the 20-position window (the reference kernels and test_tiny_families
    # check all 24)
    new_tokens = 16 if (device, kernels) == ("torch-cpu", "triton") else families.NEW_TOKENS
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    for prompt_set in reference["prompt_sets"].values():
        llm = LLM(
            model=str(families.gguf_path("gemma2")),
            device=device,
            dtype="float32",
            max_model_len=prompt_set["max_model_len"],
        )
        prompts = [{"prompt_token_ids": case["prompt_token_ids"]} for case in prompt_set["cases"]]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        expected = [case["output_token_ids"][:new_tokens] for case in prompt_set["cases"]]
        shortest = min(len(case["prompt_token_ids"]) for case in prompt_set["cases"])
        assert shortest + new_tokens - 2 > SPEC["sliding_window"]  # the last step's position
        assert [list(output.outputs.token_ids) for output in outputs] == expected


def test_past_the_window_it_needs_sliding_windows(hf_dir, monkeypatch):
    registry = get_registry()
    backend = _reduced_backend(monkeypatch, Capability.SLIDING_WINDOW)
    checkpoint = inspect_checkpoint(hf_dir, registry)
    build_model(checkpoint, backend, 20, registry)
    with pytest.raises(UnsupportedModelError, match="sliding_window=20.*max_model_len <= 20"):
        build_model(checkpoint, backend, 64, registry)


@pytest.mark.parametrize("value", [-1.0, 0, "50", True])
def test_a_bad_cap_is_named(tmp_path, value):
    families.write_checkpoint(tmp_path, "gemma2")
    tiny.write_ernie_tokenizer(tmp_path)
    config = dict(SPEC, attn_logit_softcapping=value)
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="attn_logit_softcapping must be a positive number"):
        LLM(model=str(tmp_path), max_model_len=32)
