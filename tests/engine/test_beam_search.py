"""Beam search against transformers' `generate(num_beams=k, num_return_sequences=n, ...)`.

References: tests/fixtures/decoding_references.json (tools/make_decoding_references.py): for the
embedded SmolLM2 and the tiny ERNIE-4.5 / Qwen checkpoints, k in {2, 4}, several
`length_penalty` / `early_stopping` settings; the returned beams in order, with their scores and
cumulative logprobs. For the tiny models the reference adds a second stop token (the greedy
path's third token) so that beams also finish early; it is passed here as `stop_token_ids`.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import tiny_checkpoints as tiny
from decoding_cases import beam_params, generate_checking_each_step, load_references

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.beam_search import BeamSearch
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.sequence import Sequence

TOLERANCE = 1e-4
SCORE_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def references() -> dict:
    return load_references()


def assert_beams_match(output, case) -> None:
    assert output.error_code == 200, output.error_msg
    expected = case["beams"]
    got = list(output.outputs)
    assert [sample.token_ids for sample in got] == [beam["output_token_ids"] for beam in expected]
    for sample, beam in zip(got, expected, strict=True):
        assert sample.cumulative_logprob == pytest.approx(beam["cumulative_logprob"], abs=TOLERANCE)
        # transformers' own score sums float32 logprobs of its KV-cached decode, which differ from
        # one teacher-forced pass by up to ~5e-4 over SmolLM2's 12 tokens: a looser bound, scaled
        # as the score scales the sum (by 12 for length_penalty -1: the reference's own two sums
        # then differ by up to 1.2e-3)
        length = len(sample.token_ids)
        scale = length ** -case["length_penalty"]
        assert sample.cumulative_logprob * scale == pytest.approx(
            beam["score"], abs=SCORE_TOLERANCE * max(1.0, scale)
        )
    assert [sample.index for sample in got] == list(range(len(expected)))


def assert_refcounts_hold(llm: LLM) -> None:
    """Every block's reference count equals the number of live block tables holding it."""
    engine = llm.llm_engine
    manager = engine.block_manager
    held = Counter(
        block
        for request in engine.requests.values()
        for seq in request.seqs
        if not seq.is_finished
        for block in seq.block_table
    )
    assert all(manager.ref_count(block) == held[block] for block in range(manager.num_blocks))


def run_checked(llm: LLM, prompts: list[dict], params: list[SamplingParams]) -> list:
    """`llm.generate`, checking the block reference counts after every engine step."""
    return generate_checking_each_step(llm, prompts, params, lambda: assert_refcounts_hold(llm))


def test_smollm2_beams_match_transformers_and_batch_with_greedy(llm, references, smollm2_reference):
    """All beam cases in one batch with an ordinary greedy request, which keeps its tokens."""
    engine = llm.llm_engine
    cases = references["SmolLM2-135M-Instruct"]["beam_search"]
    vocab = engine.model_config.vocab_size
    assert sorted(t for t in engine.eos_token_ids if t < vocab) == cases[0]["eos_token_ids"]
    greedy = smollm2_reference["cases"][0]
    prompts = [{"prompt_token_ids": case["prompt_token_ids"]} for case in cases]
    prompts.append({"prompt_token_ids": greedy["prompt_token_ids"]})
    params = [beam_params(case, []) for case in cases]
    params.append(SamplingParams(temperature=0, max_tokens=len(greedy["output_token_ids"])))
    outputs = run_checked(llm, prompts, params)
    for output, case in zip(outputs, cases, strict=False):
        assert_beams_match(output, case)
    assert outputs[-1].outputs.token_ids == greedy["output_token_ids"]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("name", sorted(tiny.SPECS))
def test_tiny_models_match_transformers_with_preemption(tmp_path, references, name):
    """Every case at once in a KV cache too small for them: beams are preempted and recomputed."""
    tiny.write_checkpoint(tmp_path, name, "pt")
    tiny.write_ernie_tokenizer(tmp_path)
    llm = LLM(model=str(tmp_path), max_model_len=32, block_size=4, num_gpu_blocks_override=40)
    cases = references[name]["beam_search"]
    prompts = [{"prompt_token_ids": case["prompt_token_ids"]} for case in cases]
    params = [beam_params(case, [t for t in case["eos_token_ids"] if t != 2]) for case in cases]
    outputs = run_checked(llm, prompts, params)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    for output, case in zip(outputs, cases, strict=True):
        assert_beams_match(output, case)
    manager = llm.llm_engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_beams_fork_prompt_blocks_the_prefix_cache_shares(tmp_path, references):
    """Prefix caching is on by default: run again, every root takes its prompt's full blocks from
    the cache, held at once by each request with that prompt, and its beams fork them again. The
    beams still match transformers and every count comes back to zero."""
    tiny.write_checkpoint(tmp_path, "qwen3", "pt")
    tiny.write_ernie_tokenizer(tmp_path)
    llm = LLM(model=str(tmp_path), max_model_len=32, block_size=4)
    engine = llm.llm_engine
    cases = references["qwen3"]["beam_search"]
    prompts = [{"prompt_token_ids": case["prompt_token_ids"]} for case in cases]
    params = [beam_params(case, [t for t in case["eos_token_ids"] if t != 2]) for case in cases]
    run_checked(llm, prompts, params)  # fills the cache
    both_ways = []  # blocks held by several requests (the cache) and by beams of one request (forks)

    def watching_step():
        outputs = type(engine).step(engine)
        holders: dict[int, list[str]] = {}
        for request in engine.requests.values():
            for seq in request.seqs:
                if not seq.is_finished:
                    for block in seq.block_table:
                        holders.setdefault(block, []).append(request.request_id)
        both_ways.extend(b for b, ids in holders.items() if 1 < len(set(ids)) < len(ids))
        return outputs

    engine.step = watching_step
    outputs = run_checked(llm, prompts, params)
    for output, case in zip(outputs, cases, strict=True):
        assert_beams_match(output, case)
        assert output.num_cached_tokens == (len(case["prompt_token_ids"]) - 1) // 4 * 4
    assert both_ways
    manager = engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_logprobs_of_beams_sum_to_their_cumulative_logprob(llm):
    params = SamplingParams(use_beam_search=True, temperature=0, n=2, best_of=3, max_tokens=6, logprobs=1)
    (output,) = llm.generate("The capital of France is", params, use_tqdm=False)
    for sample in output.outputs:
        assert len(sample.logprobs) == len(sample.token_ids)
        total = sum(entry[token] for entry, token in zip(sample.logprobs, sample.token_ids, strict=True))
        assert total == pytest.approx(sample.cumulative_logprob, abs=1e-6)
        assert all(len(entry) <= 2 for entry in sample.logprobs)


def test_beam_texts_decode_their_hypotheses(llm):
    """Beams fork mid-way and a reused sequence takes another beam's tokens: each returned text is
    the decode of its own tokens, never a sequence's running text."""
    params = SamplingParams(use_beam_search=True, temperature=0, n=3, best_of=3, max_tokens=8)
    (output,) = llm.generate("The capital of France is", params, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    assert len({tuple(sample.token_ids) for sample in output.outputs}) == 3
    assert [sample.text for sample in output.outputs] == [
        tokenizer.decode(sample.token_ids) for sample in output.outputs
    ]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"temperature": 0.7}, "temperature must be 0.0 with use_beam_search=True"),
        ({"top_p": 0.9}, "top_p must be 1.0 with use_beam_search=True"),
        ({"top_k": 5}, "top_k must be 0 or -1 with use_beam_search=True"),
        ({"repetition_penalty": 1.2}, "repetition_penalty must be 1.0 with use_beam_search=True"),
        ({"stop": ["."]}, "stop (stop strings) is not supported with use_beam_search=True"),
        ({"n": 3, "best_of": 2}, "best_of must be >= n (3), got 2"),
        ({"early_stopping": "sometimes"}, "early_stopping must be True, False or 'never'"),
        ({"guided_decoding": {"regex": "[a-z]+"}}, "guided_decoding (guided decoding) is not supported"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs (guided decoding) is not"),
    ],
)
def test_beam_settings_that_do_not_combine_are_refused(kwargs, fragment):
    with pytest.raises(ValueError, match="SamplingParams") as error:
        SamplingParams(**{"use_beam_search": True, "temperature": 0, **kwargs})
    assert fragment in str(error.value)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"length_penalty": 0.5}, "length_penalty only applies with use_beam_search=True"),
        ({"early_stopping": True}, "early_stopping only applies with use_beam_search=True"),
        ({"best_of": 1, "n": 2}, "best_of must be >= n (2), got 1"),
        ({"best_of": 3, "temperature": 0}, "best_of=3 > n needs random sampling"),
    ],
)
def test_beam_fields_without_beam_search_are_refused(kwargs, fragment):
    with pytest.raises(ValueError) as error:
        SamplingParams(**kwargs)
    assert fragment in str(error.value)


def test_beam_width_above_max_num_seqs_fails_alone(tmp_path):
    tiny.write_checkpoint(tmp_path, "qwen2", "pt")
    tiny.write_ernie_tokenizer(tmp_path)
    llm = LLM(model=str(tmp_path), max_model_len=32, block_size=4, num_gpu_blocks_override=32, max_num_seqs=3)
    wide = SamplingParams(use_beam_search=True, temperature=0, best_of=4, max_tokens=3)
    fine = SamplingParams(use_beam_search=True, temperature=0, best_of=3, max_tokens=3)
    outputs = llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 2, [wide, fine], use_tqdm=False)
    assert (
        outputs[0].error_code == 400
        and "best_of=4 exceeds the engine's max_num_seqs (3)" in outputs[0].error_msg
    )
    assert outputs[1].error_code == 200 and len(outputs[1].outputs) == 1


def _run_search(rows: list[list[float]], early_stopping, width: int = 1) -> list:
    """Drive one BeamSearch by hand over a 3-token vocabulary (token 0 is EOS): the same row of
    probabilities for every beam at each step."""
    params = SamplingParams(
        use_beam_search=True, temperature=0, best_of=width, early_stopping=early_stopping, max_tokens=5
    )
    root = Sequence(0, "r", 0, [1, 1], params, 5, np.random.default_rng(0), 0.0)
    search = BeamSearch(root, width, frozenset({0}), 5)
    manager = BlockManager(16, 4)
    spawned = iter(range(1, 100))
    for probs in rows:
        for beam in search.beams:
            search.add_row(beam, np.log(np.asarray(probs)))
        running = search.step()
        search.apply(
            running, manager, lambda parent: Sequence(next(spawned), "r", 0, [], params, 5, None, 0.0)
        )
        if search.done:
            break
    return search.results()


def test_early_stopping_false_stops_where_the_heuristic_says_and_never_searches_on():
    """Hand-computed: step 1 finishes [EOS] at log 0.5 = -0.693 and keeps [1] at log 0.4 = -0.916.
    The heuristic bounds [1]'s future by its score at the current length (-0.916 < -0.693): stop.
    "never" bounds it at max_tokens=5 (-0.916 / 5 > -0.693): go on, and [1, EOS] scores
    (log 0.4 + log 0.9) / 2 = -0.511, better than -0.693."""
    rows = [[0.5, 0.4, 0.1], [0.9, 0.05, 0.05]]
    (stopped,) = _run_search(rows, False)
    assert stopped.token_ids == [0] and stopped.score == pytest.approx(np.log(0.5))
    (searched,) = _run_search(rows, "never")
    assert searched.token_ids == [1, 0]
    assert searched.score == pytest.approx((np.log(0.4) + np.log(0.9)) / 2)
    assert searched.cumulative_logprob == pytest.approx(np.log(0.4) + np.log(0.9))


def test_early_stopping_true_stops_once_width_hypotheses_finished():
    """Width 2: step 1 keeps [EOS] and [1]; step 2 finishes [1, EOS]: two hypotheses, stop, even
    though [1, 2] could still do better under "never"."""
    rows = [[0.5, 0.4, 0.1], [0.3, 0.1, 0.6], [0.99, 0.005, 0.005]]
    results = _run_search(rows, True, width=2)
    assert [h.token_ids for h in results] == [[0]]  # n = 1: the better of the two
    results = _run_search(rows, "never", width=2)
    assert results[0].token_ids == [1, 2, 0]
