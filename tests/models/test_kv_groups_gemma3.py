"""Gemma 3's sliding and global layers keep KV in two groups (`engine/kv_groups.py`): the five
sliding layers of the tiny model hold only their 64-position window, the global one the whole
context. Tokens are transformers' (tests/fixtures/tiny_family_references.json) past the window,
in a cache too small for every layer to hold the whole sequence, with prefix-cache hits and with
preemption; every block comes back when the requests end."""

from __future__ import annotations

import json

import pytest
import tiny_checkpoints as tiny
import tiny_families as families
from kv_group_peaks import held_now, track_peaks
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.models.base import CausalLM
from fastdeploy.models.gemma3 import Gemma3ForCausalLM

WINDOW = 64
BLOCK = 4
CHUNK = 8
#: a key and a value of 2 KV heads x 16 float32 per layer and position
LAYER_TOKEN_BYTES = 2 * 2 * 16 * 4
PARAMS = SamplingParams(temperature=0, max_tokens=families.NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def references() -> dict:
    return json.loads(families.REFERENCES.read_text(encoding="utf-8"))["models"]["gemma3"]["prompt_sets"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("gemma3")
    families.write_checkpoint(directory, "gemma3")
    tiny.write_ernie_tokenizer(directory)
    return str(directory)


def generate(llm: LLM, cases: list[dict]) -> list[list[int]]:
    outputs = llm.generate(
        [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases], PARAMS, use_tqdm=False
    )
    for output in outputs:
        assert output.error_code == 200, output.error_msg
    return [list(output.outputs.token_ids) for output in outputs]


def test_a_long_sequence_runs_in_a_cache_too_small_for_every_layer_to_hold_it(
    checkpoint, references, monkeypatch
):
    (case,) = references["long"]["cases"]
    positions = len(case["prompt_token_ids"]) + len(case["output_token_ids"])  # 94, past the window
    # 540 layer-positions: under the 6 x 94 every layer would need for this sequence; with groups
    # the global layer's 96 (max_model_len) and the sliding layers' 5 x (window + chunk + 3 blocks)
    budget = 540 * LAYER_TOKEN_BYTES
    assert budget < 6 * positions * LAYER_TOKEN_BYTES
    settings = dict(max_model_len=96, block_size=BLOCK, max_num_batched_tokens=CHUNK, kv_cache_memory=budget)
    llm = LLM(model=checkpoint, **settings)
    peaks = track_peaks(llm)
    assert_tokens_match(generate(llm, [case]), [case["output_token_ids"]])
    full, sliding = peaks
    assert full == -(-(positions - 1) // BLOCK)  # every position but the last token's, kept
    # the window, a prefill chunk and the block manager's margin: never the whole sequence
    assert sliding <= WINDOW // BLOCK + CHUNK // BLOCK + 3 < full
    assert held_now(llm) == [0, 0]
    # the same budget with one block table for every layer (the window only a mask) is refused
    monkeypatch.setattr(Gemma3ForCausalLM, "kv_cache_groups", CausalLM.kv_cache_groups)
    with pytest.raises(InvalidArgumentError, match="fewer than max_model_len=96"):
        LLM(model=checkpoint, **settings)


def test_a_prefix_cache_hit_spans_both_groups(checkpoint, references):
    (case,) = references["long"]["cases"]
    llm = LLM(
        model=checkpoint,
        max_model_len=128,
        block_size=BLOCK,
        max_num_batched_tokens=CHUNK,
        enable_prefix_caching=True,
    )
    assert_tokens_match(generate(llm, [case]), [case["output_token_ids"]])
    prompt = {"prompt_token_ids": case["prompt_token_ids"]}
    (again,) = llm.generate([prompt], PARAMS, use_tqdm=False)
    # every whole block of the prompt but the last token's: 17 blocks of 4
    assert again.num_cached_tokens == (len(case["prompt_token_ids"]) - 1) // BLOCK * BLOCK
    assert list(again.outputs.token_ids) == case["output_token_ids"]
    assert held_now(llm) == [0, 0]


def test_preempted_sequences_resume_with_both_groups(checkpoint, references):
    cases = references["long"]["cases"] * 2 + references["short"]["cases"]
    # 30 blocks a group: one long sequence (24 global blocks) fits, two do not
    llm = LLM(
        model=checkpoint,
        max_model_len=96,
        block_size=BLOCK,
        max_num_batched_tokens=CHUNK,
        num_gpu_blocks_override=30,
    )
    assert_tokens_match(generate(llm, cases), [case["output_token_ids"] for case in cases])
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert held_now(llm) == [0, 0]


def test_ngram_drafts_rejected_past_the_window_give_their_blocks_back(checkpoint, references):
    """Speculative decoding truncates rejected drafts' blocks in every group; tokens unchanged."""
    (case,) = references["long"]["cases"]
    llm = LLM(
        model=checkpoint,
        max_model_len=128,
        block_size=BLOCK,
        max_num_batched_tokens=CHUNK,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
    )
    assert_tokens_match(generate(llm, [case]), [case["output_token_ids"]])
    assert held_now(llm) == [0, 0]


def test_beams_past_the_window_equal_those_of_one_table_for_every_layer(checkpoint, references, monkeypatch):
    """Forked beams share blocks and copy on write in each group; their outputs equal the same
    engine's with one block table for every layer (the window then only a mask)."""
    (case,) = references["long"]["cases"]
    params = SamplingParams(
        use_beam_search=True, temperature=0, n=2, best_of=3, max_tokens=12, ignore_eos=True
    )
    settings = dict(model=checkpoint, max_model_len=128, block_size=BLOCK, max_num_batched_tokens=CHUNK)
    prompt = [{"prompt_token_ids": case["prompt_token_ids"]}]

    def beams(llm: LLM) -> list[tuple[list[int], float]]:
        (output,) = llm.generate(prompt, params, use_tqdm=False)
        assert output.error_code == 200, output.error_msg
        return [(list(s.token_ids), s.cumulative_logprob) for s in output.outputs]

    grouped = LLM(**settings)
    got = beams(grouped)
    assert held_now(grouped) == [0, 0]
    monkeypatch.setattr(Gemma3ForCausalLM, "kv_cache_groups", CausalLM.kv_cache_groups)
    expected = beams(LLM(**settings))
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected]
    assert [score for _, score in got] == pytest.approx([score for _, score in expected], abs=1e-4)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_disaggregation_refuses_a_model_with_layer_groups_by_name(checkpoint, role):
    with pytest.raises(InvalidArgumentError, match=r"Gemma3ForCausalLM keeps its KV cache in 2 layer groups"):
        LLM(model=checkpoint, max_model_len=128, splitwise_role=role)
    llm = LLM(model=checkpoint, max_model_len=64, splitwise_role=role)  # within the window: one group
    if role == "prefill":
        llm.llm_engine.kv_transfer.close()  # its sender threads
