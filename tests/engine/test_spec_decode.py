"""Speculative decoding: identical greedy output, the rejection sampler's distribution, rollback,
back-off, metrics, and the configuration's names and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny_checkpoints as tiny
from decoding_cases import generate_checking_each_step
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.sequence import Sequence, SequenceStatus
from fastdeploy.engine.spec_decode.decoder import SpeculativeDecoder
from fastdeploy.engine.spec_decode.ngram import propose_ngram
from fastdeploy.engine.spec_decode.proposal import Proposal
from fastdeploy.engine.spec_decode.rejection import rejection_sample
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.speculative_config import parse_speculative_config

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
#: a prompt whose continuation copies its input (an edited copy of the function), so prompt
#: lookup drafts are mostly right
GROUNDED = (
    "# config_loader.py\n"
    "def parse_config(path):\n"
    "    settings = {}\n"
    "    with open(path) as handle:\n"
    "        for line in handle:\n"
    "            key, value = line.strip().split('=', 1)\n"
    "            settings[key.strip()] = value.strip()\n"
    "    return settings\n\n"
    "# config_loader_v2.py: the same function, with settings renamed to config\n"
)
#: tiny-model prompt that repeats itself, so lookups find matches
REPEATING = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]


def checked_generate(llm: LLM, prompts, params) -> list:
    """`llm.generate` asserting, after every step, that no sequence holds a block past its
    computed tokens (rejected drafts are rolled back) and that every block count is right."""
    engine = llm.llm_engine
    manager = engine.block_manager

    def check() -> None:
        for seq in engine.scheduler.running:
            assert len(seq.block_table) == manager.blocks_for(seq.num_computed_tokens)

    return generate_checking_each_step(llm, prompts, params, check)


@pytest.fixture(scope="module")
def spec_llm() -> LLM:
    return LLM(max_model_len=1024, max_num_seqs=16, speculative_config=NGRAM)


def test_greedy_smollm2_equals_transformers_and_plain_decoding(spec_llm, llm, smollm2_reference):
    """Every reference case and a grounded chat in one batch: speculating rows next to prefill and
    plain decode rows; greedy tokens are the reference's / plain decoding's, token for token."""
    cases = smollm2_reference["cases"]
    prompts = [{"prompt_token_ids": case["prompt_token_ids"]} for case in cases]
    params = [SamplingParams(temperature=0, max_tokens=len(case["output_token_ids"])) for case in cases]
    prompts.append(GROUNDED)
    params.append(SamplingParams(temperature=0, max_tokens=48))
    outputs = checked_generate(spec_llm, prompts, params)
    assert_tokens_match(
        [o.outputs.token_ids for o in outputs[: len(cases)]],
        [case["output_token_ids"] for case in cases],
        [case["name"] for case in cases],
    )
    (plain,) = llm.generate(prompts[-1], params[-1], use_tqdm=False)
    assert outputs[-1].outputs.token_ids == plain.outputs.token_ids
    metrics = outputs[-1].metrics
    assert metrics.spec_num_accepted_tokens > 10 and 0 < metrics.spec_acceptance_rate <= 1
    assert metrics.spec_accepted_tokens_per_step > 1
    engine = spec_llm.llm_engine
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_seeded_sampling_emits_the_same_tokens_with_and_without_lookup(spec_llm, llm):
    """Prompt lookup's verifier draws each position's token as plain decoding does."""
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=123, max_tokens=40, logprobs=1)
    (spec,) = spec_llm.generate(GROUNDED, params, use_tqdm=False)
    (plain,) = llm.generate(GROUNDED, params, use_tqdm=False)
    assert spec.outputs.token_ids == plain.outputs.token_ids
    assert spec.metrics.spec_num_draft_tokens > 0
    for ours, theirs in zip(spec.outputs.logprobs, plain.outputs.logprobs, strict=True):
        assert ours.keys() == theirs.keys()
        assert all(ours[t] == pytest.approx(theirs[t], abs=1e-4) for t in ours)


def test_text_read_at_the_end_equals_token_by_token_text(spec_llm):
    """A plain request detokenizes once when its text is read (defer_text), a request with a stop
    string after every token: with several tokens accepted per step both give the full decode."""
    base = {"temperature": 0, "max_tokens": 48, "ignore_eos": True}
    (deferred,) = spec_llm.generate(GROUNDED, SamplingParams(**base), use_tqdm=False)
    (eager,) = spec_llm.generate(GROUNDED, SamplingParams(**base, stop=["\x00never"]), use_tqdm=False)
    assert deferred.metrics.spec_num_accepted_tokens > 0 and eager.metrics.spec_num_accepted_tokens > 0
    assert deferred.outputs.token_ids == eager.outputs.token_ids
    expected = spec_llm.get_tokenizer().decode(deferred.outputs.token_ids)
    assert deferred.outputs.text == eager.outputs.text == expected


def test_a_stop_inside_a_verified_run_keeps_one_logprob_per_token(spec_llm, llm):
    """The stop string ends the sequence at the 3rd of the 5 tokens one step emits: the tokens
    after it are dropped with their logprobs (and their share of the cumulative logprob)."""
    params = SamplingParams(temperature=0, max_tokens=48, logprobs=1, stop=[" as handle"])
    (spec,) = spec_llm.generate(GROUNDED, params, use_tqdm=False)
    (plain,) = llm.generate(GROUNDED, params, use_tqdm=False)
    assert spec.metrics.spec_num_accepted_tokens > 0 and spec.outputs.finish_reason == "stop"
    assert spec.outputs.token_ids == plain.outputs.token_ids
    assert len(spec.outputs.logprobs) == len(spec.outputs.token_ids)
    for ours, theirs, token in zip(
        spec.outputs.logprobs, plain.outputs.logprobs, spec.outputs.token_ids, strict=True
    ):
        assert ours[token] == pytest.approx(theirs[token], abs=1e-4)
    assert spec.outputs.cumulative_logprob == pytest.approx(plain.outputs.cumulative_logprob, abs=1e-3)


def test_guided_requests_do_not_speculate(spec_llm, llm):
    """A guided request's mask at each position depends on the tokens before it: no drafts."""
    params = SamplingParams(temperature=0, max_tokens=24, guided_decoding={"regex": "(def [a-z_]+)+"})
    (spec,) = spec_llm.generate(GROUNDED, params, use_tqdm=False)
    (plain,) = llm.generate(GROUNDED, params, use_tqdm=False)
    assert spec.outputs.token_ids == plain.outputs.token_ids
    assert spec.metrics.spec_num_draft_tokens == 0


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, str]:
    dirs = {}
    for name in tiny.SPECS:
        directory = tmp_path_factory.mktemp(name)
        tiny.write_checkpoint(directory, name, "pt")
        tiny.write_ernie_tokenizer(directory)
        dirs[name] = str(directory)
    return dirs


def _tiny_llm(directory: str, speculative_config=None) -> LLM:
    return LLM(
        model=directory,
        max_model_len=64,
        block_size=4,
        num_gpu_blocks_override=96,
        speculative_config=speculative_config,
    )


@pytest.mark.parametrize("name", sorted(tiny.SPECS))
def test_greedy_tiny_models_equal_transformers_and_plain_decoding(tiny_dirs, name):
    references = json.loads((tiny.FIXTURES / "tiny_model_references.json").read_text(encoding="utf-8"))
    cases = references["models"][name]["cases"]
    prompts = [case["prompt_token_ids"] for case in cases] + [REPEATING]
    # 24 tokens: random models fall into loops that prompt lookup drafts, and out of them
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    spec = checked_generate(
        _tiny_llm(tiny_dirs[name], NGRAM), [{"prompt_token_ids": p} for p in prompts], params
    )
    plain = _tiny_llm(tiny_dirs[name]).generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False
    )
    assert_tokens_match(
        [o.outputs.token_ids[: tiny.NEW_TOKENS] for o in spec[: len(cases)]],
        [case["output_token_ids"] for case in cases],
    )
    assert_tokens_match([o.outputs.token_ids for o in spec], [o.outputs.token_ids for o in plain])
    drafted = sum(o.metrics.spec_num_draft_tokens for o in spec)
    accepted = sum(o.metrics.spec_num_accepted_tokens for o in spec)
    assert drafted > accepted > 0  # drafts were accepted, and rejected ones rolled back


@pytest.mark.parametrize("name", ["qwen2", "ernie4_5"])
def test_blocks_computed_by_a_verify_pass_are_cached_under_their_tokens(tiny_dirs, name):
    """Prefix caching (on by default) registers a block once all its tokens are known: the accepted
    drafts a verify pass computed become tokens only after it, so their blocks wait a pass (they
    were registered under a short token tuple no prompt matches). A prompt that repeats the
    output reuses every full block of it."""
    llm = _tiny_llm(tiny_dirs[name], NGRAM)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    (first,) = llm.generate({"prompt_token_ids": REPEATING}, params, use_tqdm=False)
    assert first.metrics.spec_num_accepted_tokens > 0
    prompt = REPEATING + first.outputs.token_ids[:16]
    (again,) = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1), use_tqdm=False)
    assert again.num_cached_tokens == (len(prompt) - 1) // 4 * 4  # every full block but the last token's


@pytest.mark.parametrize(
    ("target", "draft"), [("qwen3", "qwen3"), ("qwen3", "qwen2"), ("ernie4_5", "ernie4_5_moe")]
)
def test_draft_model_greedy_equals_plain_decoding(tiny_dirs, target, draft):
    config = {"method": "draft_model", "model": tiny_dirs[draft], "num_speculative_tokens": 3}
    prompts = [{"prompt_token_ids": p} for p in (*tiny.PROMPTS, REPEATING)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    spec = checked_generate(_tiny_llm(tiny_dirs[target], config), prompts, params)
    plain = _tiny_llm(tiny_dirs[target]).generate(prompts, params, use_tqdm=False)
    assert_tokens_match([o.outputs.token_ids for o in spec], [o.outputs.token_ids for o in plain])
    drafted = sum(o.metrics.spec_num_draft_tokens for o in spec)
    accepted = sum(o.metrics.spec_num_accepted_tokens for o in spec)
    assert drafted > 0
    if target == draft:  # the same model drafts exactly the target's tokens
        assert accepted == drafted


def test_draft_model_sampling_runs_the_rejection_sampler(tiny_dirs):
    config = {"method": "draft_model", "model": tiny_dirs["qwen2"], "num_speculative_tokens": 3}
    llm = _tiny_llm(tiny_dirs["qwen3"], config)
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=10, ignore_eos=True, logprobs=0)
    (output,) = checked_generate(llm, [{"prompt_token_ids": REPEATING}], params)
    for sample in output.outputs:
        assert len(sample.token_ids) == 10 and len(sample.logprobs) == 10
    assert output.metrics.spec_num_draft_tokens > 0


def test_a_failing_draft_model_costs_only_speculation(tiny_dirs, monkeypatch, caplog):
    """The draft model's passes (3 per step: one per draft) fail after two steps: the steps then
    decode without drafts (the proposer's sequences back off), with plain decoding's tokens."""
    config = {"method": "draft_model", "model": tiny_dirs["qwen2"], "num_speculative_tokens": 3}
    llm = _tiny_llm(tiny_dirs["qwen3"], config)
    runner = llm.llm_engine.spec_decoder.proposer.runner
    execute, calls = runner.execute, []

    def failing(batch):
        calls.append(len(batch.seqs))
        if len(calls) > 6:
            raise RuntimeError("injected fault: the draft model's pass failed")
        return execute(batch)

    monkeypatch.setattr(runner, "execute", failing)
    prompts = [{"prompt_token_ids": p} for p in (*tiny.PROMPTS, REPEATING)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    spec = checked_generate(llm, prompts, params)
    plain = _tiny_llm(tiny_dirs["qwen3"]).generate(prompts, params, use_tqdm=False)
    assert_tokens_match([o.outputs.token_ids for o in spec], [o.outputs.token_ids for o in plain])
    assert "proposer failed" in caplog.text and len(calls) > 6
    assert sum(o.metrics.spec_num_draft_tokens for o in spec) > 0  # drafts before the failure


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


#: chi-square critical value for 4 degrees of freedom at p = 0.001
CRITICAL_DF4 = 18.47


def test_rejection_sampler_keeps_the_target_distribution():
    """Over many seeded draws on a 5-token vocabulary, each emitted position follows p."""
    rng = np.random.default_rng(2024)
    p = np.array([[0.5, 0.2, 0.15, 0.1, 0.05], [0.05, 0.05, 0.3, 0.3, 0.3], [0.2, 0.2, 0.2, 0.2, 0.2]])
    q = np.array([[0.1, 0.1, 0.1, 0.2, 0.5], [0.6, 0.1, 0.1, 0.1, 0.1]])
    first, second = np.zeros(5), np.zeros(5)
    for _ in range(40000):
        drafts = [int(rng.choice(5, p=q[i])) for i in range(2)]
        emitted = rejection_sample(p, q, drafts, rng)
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    assert _chi_square(first, p[0]) < CRITICAL_DF4
    assert _chi_square(second, p[1]) < CRITICAL_DF4
    assert 0 < second.sum() < 40000  # some drafts were rejected, some accepted


def test_ngram_lookup():
    assert propose_ngram([1, 2, 3, 4, 5, 1, 2, 3], 3, 2, 5) == [4, 5, 1]
    assert propose_ngram([9, 9, 1, 2, 8, 1, 2], 2, 2, 5) == [8, 1]
    assert propose_ngram([1, 2, 3], 3, 2, 5) == []
    # the latest occurrence followed by a whole draft wins over a later, shorter one
    assert propose_ngram([7, 7, 7, 7, 7, 7], 2, 2, 2) == [7, 7]
    # the longest matching suffix decides: [3, 1, 2] occurred before, followed by 6
    assert propose_ngram([3, 1, 2, 6, 1, 2, 5, 3, 1, 2], 1, 2, 3) == [6]


class _WrongProposer:
    def propose(self, seqs, lengths):
        return [Proposal([99] * length) for length in lengths]

    def forget_except(self, live):
        return None


def test_backoff_after_consecutive_misses():
    """All drafts rejected: the sequence sits out 0, 1, 3, 7 steps before drafting again."""
    decoder = SpeculativeDecoder(_WrongProposer(), 3, max_model_len=1000)
    seq = Sequence(0, "r", 0, [1, 2, 3], SamplingParams(temperature=0), 500, np.random.default_rng(0), 0.0)
    seq.status = SequenceStatus.RUNNING
    seq.num_computed_tokens = 2
    drafted_steps = []
    for step in range(20):
        decoder.propose([seq])
        if decoder.drafts.get(seq.seq_id):
            drafted_steps.append(step)
            decoder._account(seq, len(decoder.drafts[seq.seq_id]), 0)
    assert drafted_steps == [0, 1, 3, 7, 15]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (
            {"method": "eagle", "num_speculative_tokens": 1},
            "method must be one of ngram, draft_model, mtp, got 'eagle'",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 0},
            "num_speculative_tokens must be in [1, 16], got 0",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 17},
            "num_speculative_tokens must be in [1, 16], got 17",
        ),
        ({"method": "ngram"}, "num_speculative_tokens must be in [1, 16], got None"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "max_ngram_size": 1, "min_ngram_size": 3},
            "min_ngram_size",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "max_ngram_size": 4, "prompt_lookup_max": 5},
            "same setting",
        ),
        ({"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}, "unknown key(s) bogus"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "speculative_config.model must name"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_speculative_configs_name_the_field(raw, fragment):
    with pytest.raises(InvalidArgumentError) as error:
        parse_speculative_config(raw)
    assert fragment in str(error.value)


def test_config_names_from_fastdeploy_and_vllm():
    fastdeploy = parse_speculative_config(
        '{"method": "ngram", "num_speculative_tokens": 3, "max_ngram_size": 4}'
    )
    vllm = parse_speculative_config(
        {"method": "[ngram]", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    )
    assert fastdeploy == vllm and fastdeploy.max_ngram_size == 4 and fastdeploy.min_ngram_size == 2
    assert parse_speculative_config({"model": "x", "num_speculative_tokens": 2}).method == "draft_model"


def test_draft_model_with_another_vocabulary_is_refused(tiny_dirs):
    with pytest.raises(InvalidArgumentError, match="must share the target's"):
        LLM(max_model_len=256, speculative_config={"model": tiny_dirs["qwen2"], "num_speculative_tokens": 2})
