"""LoRA adapters offline: several adapters and the base model in one batch give transformers +
peft's greedy tokens, adapters beyond `max_loras` wait for a slot, prefix-cache blocks are never
shared between adapters, and bad adapters fail their request alone with a clear message."""

from __future__ import annotations

import json
import os
import shutil

import lora_fixtures as fixtures
import numpy as np
import pytest
import tiny_checkpoints as tiny
from token_match import assert_outputs_match, assert_tokens_match

from fastdeploy import LLM, LoRARequest, SamplingParams
from fastdeploy.errors import InvalidArgumentError

GREEDY = SamplingParams(temperature=0.0, max_tokens=fixtures.NEW_TOKENS, ignore_eos=True)


def _requests(adapters: dict[str, str]) -> dict[str, LoRARequest]:
    return {name: LoRARequest(name, index + 1, path) for index, (name, path) in enumerate(adapters.items())}


def _mixed_batch(adapters: dict[str, str]) -> tuple[list[dict], list[LoRARequest | None], list[tuple]]:
    """Every prompt under every adapter and the base model, interleaved (adapters' rows not contiguous)."""
    requests = _requests(adapters)
    prompts, loras, keys = [], [], []
    for prompt_index, prompt in enumerate(fixtures.PROMPTS):
        for name in (*requests, None):
            prompts.append({"prompt_token_ids": prompt})
            loras.append(None if name is None else requests[name])
            keys.append((name, prompt_index))
    return prompts, loras, keys


@pytest.fixture(scope="module")
def engine(llama_dir) -> LLM:
    return LLM(llama_dir, device="cpu", enable_lora=True, max_loras=4, max_lora_rank=8, max_num_seqs=16)


def test_adapters_change_the_reference(reference_tokens):
    """Otherwise matching the reference would not show the adapters were applied."""
    for name, tokens in reference_tokens.items():
        if name is not None:
            assert tokens != reference_tokens[None], name


def test_mixed_batch_matches_transformers_and_peft(engine, adapters, reference_tokens):
    prompts, loras, keys = _mixed_batch(adapters)
    backend = engine.llm_engine.backend
    seen: list[tuple[int, bool]] = []  # per pass: adapters, and whether base-model rows are in it
    original = backend.lora_rows

    def spy(token_slots: np.ndarray):
        seen.append(
            (len({slot for slot in token_slots.tolist() if slot >= 0}), bool((token_slots < 0).any()))
        )
        return original(token_slots)

    backend.lora_rows = spy
    try:
        outputs = engine.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    finally:
        del backend.lora_rows
    assert_outputs_match(outputs, [reference_tokens[name][index] for name, index in keys], keys)
    assert (len(adapters), True) in seen  # all three adapters and the base model in one pass


def test_one_adapter_per_call_and_chat_takes_one_too(engine, adapters, reference_tokens):
    request = _requests(adapters)["attn-r4"]
    outputs = engine.generate(
        [{"prompt_token_ids": p} for p in fixtures.PROMPTS], GREEDY, use_tqdm=False, lora_request=request
    )
    assert_tokens_match([o.outputs[0].token_ids for o in outputs], reference_tokens["attn-r4"])


def test_adapters_beyond_max_loras_wait_for_a_slot(llama_dir, adapters, reference_tokens):
    """One slot, three adapters and the base model queued together: every request finishes with
    its own adapter's tokens, and at most one adapter is resident at any time."""
    llm = LLM(llama_dir, device="cpu", enable_lora=True, max_loras=1, max_lora_rank=8, max_cpu_loras=2)
    prompts, loras, keys = _mixed_batch(adapters)
    seen: list[int] = []
    backend, original = llm.llm_engine.backend, llm.llm_engine.backend.lora_rows
    backend.lora_rows = lambda slots: seen.append(len(set(slots.tolist()) - {-1})) or original(slots)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    expected = [reference_tokens[name][index] for name, index in keys]
    assert_tokens_match([o.outputs[0].token_ids for o in outputs], expected, keys)
    assert max(seen) == 1
    assert len(llm.llm_engine.loras.resident()) == 1
    assert len(llm.llm_engine.loras.loaded()) <= 2  # max_cpu_loras: the others are read again when needed


def test_prefix_cache_is_keyed_by_adapter(llama_dir, adapters):
    llm = LLM(llama_dir, device="cpu", enable_lora=True, max_loras=2, max_lora_rank=8, block_size=4)
    requests = _requests(adapters)
    prompt = [{"prompt_token_ids": [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41]}]
    one_token = SamplingParams(temperature=0.0, max_tokens=1)

    def cached(lora: LoRARequest | None) -> int:
        return llm.generate(prompt, one_token, use_tqdm=False, lora_request=lora)[0].num_cached_tokens

    assert cached(requests["all-r8"]) == 0
    assert cached(requests["all-r8"]) == 8  # two full blocks of the same adapter
    assert cached(requests["attn-r4"]) == 0  # same tokens, another adapter: nothing shared
    assert cached(None) == 0  # nor the base model
    assert cached(None) == 8


def _write_variant(source: str, target: str, config_changes: dict) -> str:
    """A copy of adapter `source` with its adapter_config.json changed."""
    shutil.copytree(source, target)
    with open(os.path.join(target, "adapter_config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    config.update(config_changes)
    with open(os.path.join(target, "adapter_config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    return target


def test_bad_adapters_fail_alone_with_clear_errors(engine, adapters, tmp_path, llama_dir, reference_tokens):
    qwen_dir = tmp_path / "qwen3"
    tiny.write_checkpoint(qwen_dir, "qwen3", "pt")
    other_base = fixtures.make_peft_adapter(
        str(qwen_dir), str(tmp_path / "qwen-adapter"), seed=5, rank=4, alpha=4, targets=["q_proj", "v_proj"]
    )
    lacking = _write_variant(
        adapters["attn-r4"],
        str(tmp_path / "lacking"),
        {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "c_fc"]},
    )
    bad = {
        "rank": (LoRARequest("big", 11, adapters["all-r8"]), "rank 8 is above max_lora_rank=4"),
        "lacking": (LoRARequest("lacking", 12, lacking), "targets c_fc, which LlamaForCausalLM lacks"),
        "base": (LoRARequest("qwen", 13, other_base), "does not match this base model"),
        "missing": (LoRARequest("gone", 14, str(tmp_path / "nowhere")), "no such directory or .gguf file"),
    }
    small = LLM(llama_dir, device="cpu", enable_lora=True, max_loras=2, max_lora_rank=4)
    good = LoRARequest("attn-r4", 2, adapters["attn-r4"])
    prompts = [{"prompt_token_ids": fixtures.PROMPTS[0]}] * (len(bad) + 1)
    outputs = small.generate(
        prompts, GREEDY, use_tqdm=False, lora_request=[good] + [r for r, _ in bad.values()]
    )
    assert outputs[0].outputs[0].token_ids == reference_tokens["attn-r4"][0]
    for output, (request, message) in zip(outputs[1:], bad.values(), strict=True):
        assert output.error_code == 400
        assert message in output.error_msg and repr(request.lora_name) in output.error_msg


def test_lora_request_arguments_are_checked(engine, adapters):
    with pytest.raises(InvalidArgumentError, match="lora_int_id must be an int >= 1"):
        LoRARequest("x", 0, "/tmp")
    with pytest.raises(InvalidArgumentError, match="2 lora_request entries for 1 prompts"):
        engine.generate([[1, 2]], GREEDY, use_tqdm=False, lora_request=[None, None])
    same_id = LoRARequest("other", 1, adapters["attn-r4"])  # id 1 is all-r8 in the engine already
    engine.generate(
        [[1, 2]], GREEDY, use_tqdm=False, lora_request=LoRARequest("all-r8", 1, adapters["all-r8"])
    )
    output = engine.generate([[1, 2]], GREEDY, use_tqdm=False, lora_request=same_id)[0]
    assert "lora_int_id 1 already names adapter 'all-r8'" in output.error_msg


def test_enable_lora_refusals(llama_dir):
    llm_without = LLM(llama_dir, device="cpu", max_num_seqs=2)
    output = llm_without.generate(
        [[1, 2]], GREEDY, use_tqdm=False, lora_request=LoRARequest("a", 1, llama_dir)
    )[0]
    assert "needs an engine built with enable_lora=True" in output.error_msg
    with pytest.raises(InvalidArgumentError, match="max_cpu_loras .* must be >= max_loras"):
        LLM(llama_dir, device="cpu", enable_lora=True, max_loras=3, max_cpu_loras=2)
    with pytest.raises(InvalidArgumentError, match="speculative_config"):
        LLM(
            llama_dir,
            device="cpu",
            enable_lora=True,
            speculative_config={"method": "ngram", "num_speculative_tokens": 2},
        )
    with pytest.raises(InvalidArgumentError, match="runner='pooling'"):
        LLM(llama_dir, device="cpu", enable_lora=True, runner="pooling")


def test_mixed_batch_on_the_cuda_backends_code(llama_dir, adapters, reference_tokens):
    """torch-cpu runs the cuda backend's code (its LoRA ops, async scheduling) on the host."""
    pytest.importorskip("torch", reason="the torch-cpu backend needs torch (the test extra installs it)")
    llm = LLM(llama_dir, device="torch-cpu", enable_lora=True, max_loras=4, max_lora_rank=8, max_num_seqs=16)
    prompts, loras, keys = _mixed_batch(adapters)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    expected = [reference_tokens[name][index] for name, index in keys]
    assert_tokens_match([o.outputs[0].token_ids for o in outputs], expected, keys)
