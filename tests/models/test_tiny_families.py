"""Phi-3 (LongRoPE, partial rotary), Phi-4, Mixtral, Qwen2-MoE, Qwen3-MoE, Gemma 2, Gemma 3 and ERNIE-4.5
(dense, MoE) against transformers, each as a Hugging Face directory and as the GGUF llama.cpp's own
converter wrote of the same weights.

The tiny random-weight models are rebuilt from their seeds (tests/models/tiny_families.py,
tiny_checkpoints.py); transformers' greedy tokens (24 per prompt) and first-step logits come
from tools/make_family_references.py, committed as tests/fixtures/tiny_family_references.json,
and the GGUF files under tests/fixtures/gguf/ from the same tool. Neither torch, transformers
nor llama.cpp is needed here.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import tiny_checkpoints as tiny
import tiny_families as families
from token_match import assert_outputs_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.capabilities import Capability
from fastdeploy.backends.selection import create_backend
from fastdeploy.errors import InvalidArgumentError, UnsupportedModelError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.gguf_file import read_gguf
from fastdeploy.input.family_templates import GEMMA_CHAT_TEMPLATE
from fastdeploy.model_executor.loaders.gguf_loader import config_from_gguf, config_from_metadata
from fastdeploy.model_executor.model_loader import build_model, inspect_checkpoint
from fastdeploy.plugins.registry import get_registry

#: float32 tolerance for logits of magnitude ~10 after a few layers
ATOL = 1e-4
ERNIE_MODELS = ("ernie4_5", "ernie4_5_moe")
HF_MODELS = [*families.SPECS, *ERNIE_MODELS]
GGUF_MODELS = [*families.GGUF_MODELS, *ERNIE_MODELS]
FORMS = [(name, "hf") for name in families.SPECS] + [(name, "gguf") for name in GGUF_MODELS]


@pytest.fixture(scope="module")
def references() -> dict:
    return json.loads(families.REFERENCES.read_text(encoding="utf-8"))["models"]


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory) -> dict[str, str]:
    dirs = {}
    for name in families.SPECS:
        directory = tmp_path_factory.mktemp(name)
        families.write_checkpoint(directory, name)
        tiny.write_ernie_tokenizer(directory)
        dirs[name] = str(directory)
    return dirs


def model_path(name: str, form: str, hf_dirs: dict[str, str]) -> str:
    return hf_dirs[name] if form == "hf" else str(families.gguf_path(name))


def test_fixture_weights_are_the_ones_the_tests_rebuild(references):
    """A changed numpy random stream would make every comparison below meaningless."""
    assert set(references) == set(HF_MODELS)
    for name, entry in references.items():
        if name in ERNIE_MODELS:
            config, weights = tiny.SPECS[name]["config"], tiny.pt_tensors(name)
        else:
            config, weights = families.SPECS[name]["config"], families.tensors(name)
        assert entry["config"] == config, name
        assert entry["weights_sha256"] == tiny.weights_checksum(weights), (
            f"{name}: the seeded weights differ from those the fixture was made with; "
            "regenerate it with tools/make_family_references.py"
        )


def test_the_gguf_files_hold_the_same_weights_as_the_directories():
    """The committed GGUFs are conversions of exactly the seeded weights (llama.cpp permutes
    Mixtral's q/k rows for its rotary and adds 1 to Gemma's norms; the loader undoes both, so
    compare through it)."""
    registry = get_registry()
    for name in GGUF_MODELS:
        checkpoint = inspect_checkpoint(str(families.gguf_path(name)), registry)
        loaded = {key: np.asarray(value) for key, value in checkpoint.loader.load_tensors(checkpoint.path)}
        expected = tiny.pt_tensors(name) if name in ERNIE_MODELS else families.tensors(name)
        assert set(loaded) == set(expected), name
        for key, value in expected.items():
            actual = loaded[key].reshape(value.shape)
            if name in ("gemma2", "gemma3") and key.endswith("norm.weight"):
                # llama.cpp stores the scale 1 + w, which is what both sides compute with
                actual, value = actual + np.float32(1), value + np.float32(1)
            np.testing.assert_array_equal(actual, value, err_msg=f"{name} {key}")


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f"{f[0]}-{f[1]}")
def test_first_step_logits_match_transformers(form, hf_dirs, references):
    name, kind = form
    registry = get_registry()
    checkpoint = inspect_checkpoint(model_path(name, kind, hf_dirs), registry)
    backend = create_backend("cpu", BackendOptions(threads=1), registry)
    for prompt_set in references[name]["prompt_sets"].values():
        model = build_model(checkpoint, backend, prompt_set["max_model_len"], registry)
        for case in prompt_set["cases"]:
            logits = tiny.prefill_logits(model, backend, case["prompt_token_ids"])
            np.testing.assert_allclose(logits[-1], case["first_logits"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f"{f[0]}-{f[1]}")
def test_llm_generates_the_reference_greedy_tokens(form, hf_dirs, references):
    """GGUFs run with the tokenizer their own metadata describes (SentencePiece or BPE)."""
    name, kind = form
    params = SamplingParams(temperature=0, max_tokens=families.NEW_TOKENS, ignore_eos=True)
    for prompt_set in references[name]["prompt_sets"].values():
        llm = LLM(model=model_path(name, kind, hf_dirs), max_model_len=prompt_set["max_model_len"])
        cases = prompt_set["cases"]
        outputs = llm.generate(
            [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases], params, use_tqdm=False
        )
        assert_outputs_match(outputs, [c["output_token_ids"] for c in cases])


def test_gguf_configs_carry_what_the_architectures_need():
    """What config_from_gguf recovers from llama.cpp's keys and tensor table, against the
    config.json the GGUF was converted from."""
    for name in families.GGUF_MODELS:
        source = families.SPECS[name]["config"]
        config = config_from_gguf(read_gguf(families.gguf_path(name)))
        assert config["architectures"] == source["architectures"], name
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
            assert config[key] == source[key], (name, key)
    phi3 = config_from_gguf(read_gguf(families.gguf_path("phi3")))
    source = families.SPECS["phi3"]["config"]
    assert phi3["partial_rotary_factor"] == source["partial_rotary_factor"]
    assert phi3["original_max_position_embeddings"] == source["original_max_position_embeddings"]
    for key in ("long_factor", "short_factor"):
        np.testing.assert_allclose(phi3["rope_scaling"][key], source["rope_scaling"][key], rtol=1e-6)


def test_unsupported_gguf_architecture_lists_the_supported_ones():
    with pytest.raises(UnsupportedModelError, match=r"'gemma9'.*supported: .*phi3.*qwen3moe"):
        config_from_metadata({"general.architecture": "gemma9"})


def _write_with_config(directory, name: str, **changes) -> str:
    families.write_checkpoint(directory, name)
    config = dict(families.SPECS[name]["config"])
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    tiny.write_ernie_tokenizer(directory)
    return str(directory)


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("mixtral", "num_local_experts"),
        ("qwen3_moe", "num_experts_per_tok"),
        ("qwen2_moe", "shared_expert_intermediate_size"),
        ("phi3", "original_max_position_embeddings"),
    ],
)
def test_a_missing_config_field_is_named(tmp_path, name, field):
    directory = _write_with_config(tmp_path, name, **{field: None})
    with pytest.raises(InvalidArgumentError, match=field):
        LLM(model=directory, max_model_len=32)


def test_qwen3_moe_config_as_transformers_5_saves_it(tmp_path, references):
    """transformers 5 writes Qwen3-MoE's `num_experts` as `num_local_experts`: same model, same
    logits as transformers computed for the original config."""
    experts = families.SPECS["qwen3_moe"]["config"]["num_experts"]
    directory = _write_with_config(tmp_path, "qwen3_moe", num_experts=None, num_local_experts=experts)
    registry = get_registry()
    backend = create_backend("cpu", BackendOptions(threads=1), registry)
    prompt_set = next(iter(references["qwen3_moe"]["prompt_sets"].values()))
    model = build_model(
        inspect_checkpoint(directory, registry), backend, prompt_set["max_model_len"], registry
    )
    case = prompt_set["cases"][0]
    logits = tiny.prefill_logits(model, backend, case["prompt_token_ids"])
    np.testing.assert_allclose(logits[-1], case["first_logits"], atol=ATOL, rtol=0)


def test_phi3_longrope_factors_of_the_wrong_length_are_refused(tmp_path):
    scaling = dict(families.SPECS["phi3"]["config"]["rope_scaling"], short_factor=[1.0, 2.0])
    directory = _write_with_config(tmp_path, "phi3", rope_scaling=scaling)
    with pytest.raises(InvalidArgumentError, match="short_factor has 2 entries"):
        LLM(model=directory, max_model_len=32)


def _without_sliding_window(monkeypatch) -> Any:
    """A cpu backend that does not declare Capability.SLIDING_WINDOW (as a third-party backend may not)."""
    backend = create_backend("cpu", BackendOptions(threads=1), get_registry())
    reduced = type(backend).capabilities - {Capability.SLIDING_WINDOW}
    monkeypatch.setattr(type(backend), "capabilities", reduced)
    return backend


def test_a_window_beyond_the_backend_is_refused_by_name(tmp_path, monkeypatch):
    directory = _write_with_config(tmp_path, "phi4", sliding_window=16)
    registry = get_registry()
    backend = _without_sliding_window(monkeypatch)
    checkpoint = inspect_checkpoint(directory, registry)
    build_model(checkpoint, backend, 16, registry)  # within the window: plain causal attention
    with pytest.raises(UnsupportedModelError, match="Capability.SLIDING_WINDOW.*max_model_len <= 16"):
        build_model(checkpoint, backend, 32, registry)


def test_sentencepiece_ggufs_bring_their_tokenizer_and_gemma_its_family_template():
    """The GGUFs llama.cpp's converter wrote with a SentencePiece tokenizer.model (and no chat
    template) run with the tokenizer their metadata describes; Gemma 3's gets Gemma's turns."""
    metadata = read_gguf(families.gguf_path("gemma3")).metadata
    assert metadata["tokenizer.ggml.model"] == "llama" and "tokenizer.chat_template" not in metadata
    tokenizer = LLM(model=str(families.gguf_path("gemma3")), max_model_len=32).get_tokenizer()
    assert tokenizer.vocab_size == len(metadata["tokenizer.ggml.tokens"])
    assert tokenizer.chat_template == GEMMA_CHAT_TEMPLATE
    text = tokenizer.apply_chat_template([{"role": "user", "content": "A river"}])
    assert text == "<s><start_of_turn>user\nA river<end_of_turn>\n<start_of_turn>model\n"
    ids = tokenizer.encode("A river begins as rain.", add_special_tokens=False)
    assert tokenizer.decode(ids) == "A river begins as rain."


def test_gemma3_beyond_its_sliding_window_needs_the_capability(hf_dirs, monkeypatch):
    """Within the window it is full causal attention; past it the backend must slide."""
    registry = get_registry()
    backend = _without_sliding_window(monkeypatch)
    with pytest.raises(UnsupportedModelError, match="sliding_window=64.*max_model_len <= 64"):
        build_model(inspect_checkpoint(hf_dirs["gemma3"], registry), backend, 128, registry)


def test_gemma3_past_its_window_on_the_cuda_backends_code(references):
    """Gemma 3's five sliding layers (window 64) and its global one on the cuda backend's code
    (`torch-cpu`, reference kernels; the Triton kernels' windows are checked in tests/backends): a
    70-token prompt and its generation cross the window, and the tokens are transformers'."""
    pytest.importorskip("torch", reason="the torch-cpu backend needs torch (the test extra installs it)")
    prompt_set = references["gemma3"]["prompt_sets"]["long"]
    (case,) = prompt_set["cases"]
    llm = LLM(
        model=str(families.gguf_path("gemma3")),
        device="torch-cpu",
        dtype="float32",
        max_model_len=prompt_set["max_model_len"],
    )
    assert [layer.attention.window for layer in llm.llm_engine.runner.model.layers] == [64] * 5 + [0]
    params = SamplingParams(temperature=0, max_tokens=len(case["output_token_ids"]), ignore_eos=True)
    (output,) = llm.generate([{"prompt_token_ids": case["prompt_token_ids"]}], params, use_tqdm=False)
    assert len(case["prompt_token_ids"]) + len(case["output_token_ids"]) > 64
    assert output.outputs.token_ids == case["output_token_ids"]


def test_only_the_sliding_layers_carry_the_window(hf_dirs):
    """Gemma 3's pattern 6: five sliding layers, then a global one; within the window none slide."""
    registry = get_registry()
    backend = create_backend("cpu", BackendOptions(threads=1), registry)
    checkpoint = inspect_checkpoint(hf_dirs["gemma3"], registry)
    for max_model_len, windows in ((128, [64] * 5 + [0]), (64, [0] * 6)):
        model = build_model(checkpoint, backend, max_model_len, registry)
        assert [layer.attention.window for layer in model.layers] == windows


def test_quantised_expert_stacks_are_split_in_their_blocks(references):
    """llama.cpp's Q8_0 Mixtral: each expert's matrix stays in its blocks (a GGMLTensor), within
    Q8_0's rounding of the seeded weight of the same expert; the model stays near transformers'
    float32 logits."""
    path = str(families.gguf_path("mixtral", "q8_0"))
    registry = get_registry()
    checkpoint = inspect_checkpoint(path, registry)
    loaded = dict(checkpoint.loader.load_tensors(path))
    expected = families.tensors("mixtral")
    experts = [key for key in expected if ".experts." in key]
    assert len(experts) == 2 * 4 * 3
    for key in experts:
        assert isinstance(loaded[key], GGMLTensor), key
        value = expected[key]
        # Q8_0: 32-value blocks scaled by max|x| / 127 (the scale in float16): within 0.6 steps
        step = np.abs(value).max() / 127
        np.testing.assert_allclose(np.asarray(loaded[key]), value, rtol=0, atol=0.6 * step)
    backend = create_backend("cpu", BackendOptions(threads=1), registry)
    model = build_model(checkpoint, backend, 64, registry)
    for case in references["mixtral"]["prompt_sets"]["short"]["cases"]:
        logits = tiny.prefill_logits(model, backend, case["prompt_token_ids"])[-1]
        np.testing.assert_allclose(logits, case["first_logits"], atol=0.1, rtol=0)


def test_a_sliding_model_runs_in_a_cache_smaller_than_its_context(references):
    """Phi-3 with a 20-position window on every layer, 8-slot blocks and 16-token prefill chunks:
    the 94 positions of prompt + generation need 12 blocks, the cache has 8 (the planner sizes
    a sequence by its window and chunk, the block manager releases what the window left behind);
    the tokens are still transformers'."""
    prompt_set = references["phi3_window"]["prompt_sets"]["long"]
    (case,) = prompt_set["cases"]
    assert len(case["prompt_token_ids"]) + len(case["output_token_ids"]) > 8 * 8
    llm = LLM(
        model=str(families.gguf_path("phi3_window")),
        max_model_len=prompt_set["max_model_len"],
        block_size=8,
        max_num_batched_tokens=16,
        num_gpu_blocks_override=8,
    )
    params = SamplingParams(temperature=0, max_tokens=families.NEW_TOKENS, ignore_eos=True)
    (output,) = llm.generate([{"prompt_token_ids": case["prompt_token_ids"]}], params, use_tqdm=False)
    assert output.outputs.token_ids == case["output_token_ids"]
