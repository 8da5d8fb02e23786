"""Fault isolation with the decoding features: a pass that fails for one request is run again one
sequence at a time, and beams (with the copy-on-write KV copies of that pass), best_of samples, a
prompt scoring its tokens (prompt logprobs) and sequences verifying drafts finish exactly as on
the plain cpu engine (the shared `llm` fixture).

The faults come from the test-only plugin in tests/fault_injection (see test_fault_isolation.py):
the `faulty` backend raises, or gives NaN, for a pass whose tokens include a marker token.
"""

from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.fault_isolation import FORWARD_ERROR, NONFINITE_LOGITS

RAISE_TOKEN, NAN_TOKEN = 49100, 49101
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
#: a prompt whose continuation copies its input, so prompt lookup drafts from the first steps
GROUNDED = (
    "Copy this list exactly.\n"
    "apples, pears, plums, cherries, lemons, limes, figs, dates, grapes, melons\n"
    "Copy:\napples, pears, plums,"
)
BEAMS = SamplingParams(use_beam_search=True, temperature=0, n=2, best_of=3, max_tokens=10)
BEST_OF = SamplingParams(n=2, best_of=3, temperature=0.8, seed=11, max_tokens=10, logprobs=1)
SCORED = SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=2)
COPYING = SamplingParams(temperature=0, max_tokens=16, logprobs=1)
PROMPTS = {
    "beams": "The capital of France is",
    "best_of": "Once upon a time",
    "scored": "Water boils at one hundred degrees",
    "copying": GROUNDED,
}
PARAMS = {"beams": BEAMS, "best_of": BEST_OF, "scored": SCORED, "copying": COPYING}
#: the requests that run before the fault, so that they decode (beams forked, drafts) in its pass
EARLY = ("beams", "best_of", "copying")


@pytest.fixture(scope="module")
def faulty(fault_env):
    fault_env.setenv("FD_FAULT_RAISE_TOKEN", str(RAISE_TOKEN))
    fault_env.setenv("FD_FAULT_NAN_TOKEN", str(NAN_TOKEN))
    return LLM(device="faulty", max_model_len=1024, max_num_seqs=32, speculative_config=NGRAM)


@pytest.fixture(scope="module")
def expected(llm) -> dict:
    names = list(PROMPTS)
    outputs = llm.generate([PROMPTS[n] for n in names], [PARAMS[n] for n in names], use_tqdm=False)
    return dict(zip(names, outputs, strict=True))


def assert_same_outputs(got, want) -> None:
    assert got.error_code == 200, got.error_msg
    assert [s.token_ids for s in got.outputs] == [s.token_ids for s in want.outputs]
    for ours, theirs in zip(got.outputs, want.outputs, strict=True):
        assert (ours.cumulative_logprob is None) == (theirs.cumulative_logprob is None)
        if ours.cumulative_logprob is not None:
            assert ours.cumulative_logprob == pytest.approx(theirs.cumulative_logprob, abs=1e-4)
        if theirs.logprobs is not None:  # one entry per token: a retried pass records nothing twice
            assert len(ours.logprobs) == len(ours.token_ids)
            for mine, reference, token in zip(ours.logprobs, theirs.logprobs, ours.token_ids, strict=True):
                assert mine[token] == pytest.approx(reference[token], abs=1e-4)
    if want.prompt_logprobs is not None:
        assert len(got.prompt_logprobs) == len(want.prompt_logprobs)
        for mine, reference in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:], strict=True):
            assert mine.keys() == reference.keys()
            assert all(mine[t] == pytest.approx(reference[t], abs=1e-4) for t in mine)


def record_passes(engine, monkeypatch) -> list:
    """The batches each forward pass of `engine` ran, with their drafts and block copies as sent."""
    passes = []
    execute = engine.runner.execute

    def recording(batch):
        drafts = [list(batch.drafts.get(index, [])) for index in range(len(batch.seqs))]
        passes.append((batch, drafts, list(batch.block_copies)))
        return execute(batch)

    monkeypatch.setattr(engine.runner, "execute", recording)
    return passes


def run(engine, late: dict[str, list[int]]) -> dict:
    """The requests of EARLY, then after their first step the `late` ones ({id: prompt ids}), to the end."""
    tokenizer = engine.tokenizer
    for name in EARLY:
        engine.add_request(name, tokenizer.encode(PROMPTS[name]), PARAMS[name])
    outputs = {output.request_id: output for output in engine.step()}
    for name, ids in late.items():
        engine.add_request(name, ids, PARAMS.get(name, SamplingParams(temperature=0, max_tokens=4)))
    faults = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id] = output
        faults.update({f.request_id: f.kind for f in engine.fault_isolation.faults_in_step})
    outputs["faults"] = faults
    return outputs


@pytest.mark.parametrize(("marker", "kind"), [(RAISE_TOKEN, FORWARD_ERROR), (NAN_TOKEN, NONFINITE_LOGITS)])
def test_beams_best_of_prompt_logprobs_and_drafts_survive_a_retried_pass(
    faulty, expected, llm, monkeypatch, marker, kind
):
    engine = faulty.llm_engine
    passes = record_passes(engine, monkeypatch)
    tokenizer = engine.tokenizer
    victim = [*tokenizer.encode("Tell me about"), marker, *tokenizer.encode(" please")]
    scored = tokenizer.encode(PROMPTS["scored"])
    outputs = run(engine, {"victim": victim, "scored": scored})
    assert outputs["faults"] == {"victim": kind}
    assert outputs["victim"].error_code == 500
    for name in PROMPTS:
        assert_same_outputs(outputs[name], expected[name])
    # the failed pass held every feature: a fork's block copies, drafts to verify, a prompt to score
    failed = next(
        i for i, (batch, _, _) in enumerate(passes) if any(s.request_id == "victim" for s in batch.seqs)
    )
    batch, drafts, copies = passes[failed]
    assert copies and any(drafts) and any(seq.request_id == "scored" for seq in batch.seqs)
    assert {s.request_id for s in batch.seqs} >= set(PROMPTS)
    # then each sequence alone, a beam with the copies into its own blocks
    solo = passes[failed + 1 : failed + 1 + len(batch.seqs)]
    assert all(len(part.seqs) == 1 for part, _, _ in solo)
    assert sorted(pair for _, _, part_copies in solo for pair in part_copies) == sorted(copies)
    blocks = engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks


def test_a_failed_block_copy_is_made_again_when_the_pass_is_retried(faulty, expected, monkeypatch):
    """The copy-on-write of a beam fork itself fails once: the solo passes make each beam's copy."""
    engine = faulty.llm_engine
    backend = engine.runner.backend
    copy = backend.copy_kv_blocks
    failures = []

    def fails_once(kv_caches, pairs, block_size):
        if not failures:
            failures.append(pairs)
            raise RuntimeError("injected fault: block copy failed")
        copy(kv_caches, pairs, block_size)

    monkeypatch.setattr(backend, "copy_kv_blocks", fails_once)
    (output,) = faulty.generate(PROMPTS["beams"], BEAMS, use_tqdm=False)
    assert failures and engine.fault_isolation.faults_in_step == []
    assert_same_outputs(output, expected["beams"])
