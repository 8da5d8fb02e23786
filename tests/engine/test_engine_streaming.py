"""LLMEngine directly: streamed progress, aborts, reasoning split and reasoning_max_tokens."""

import numpy as np
import pytest

from fastdeploy import SamplingParams
from fastdeploy.backends.capabilities import Capability
from fastdeploy.reasoning.base import ReasoningParser, ReasoningSplit
from fastdeploy.text_utils import partial_suffix_length

PROMPT = "The capital of France is"


def drain(engine):
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    return outputs


def test_stream_emits_growing_text_that_ends_as_the_plain_result(llm):
    engine = llm.llm_engine
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=12)
    final = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs
    engine.add_request("stream-1", tok.encode(PROMPT), params, prompt=PROMPT, stream=True)
    updates = [o for o in drain(engine) if o.request_id == "stream-1"]
    assert len(updates) == 12 and [u.finished for u in updates] == [False] * 11 + [True]
    for earlier, later in zip(updates, updates[1:], strict=False):
        assert later.outputs.text.startswith(earlier.outputs.text)
        assert later.outputs.token_ids[: len(earlier.outputs.token_ids)] == earlier.outputs.token_ids
    assert updates[-1].outputs.text == final.text and updates[-1].outputs.token_ids == final.token_ids


def test_stream_never_shows_a_stop_string_prefix(llm):
    engine = llm.llm_engine
    tok = llm.get_tokenizer()
    # greedy output is " Paris.\n\nThe answer is: ..."; stop on "\n\nThe answer" (several tokens)
    params = SamplingParams(temperature=0, max_tokens=20, stop=["\n\nThe answer"])
    engine.add_request("stream-2", tok.encode(PROMPT), params, stream=True)
    updates = [o for o in drain(engine) if o.request_id == "stream-2"]
    assert updates[-1].outputs.text == " Paris." and updates[-1].outputs.finish_reason == "stop"
    assert all("\n" not in u.outputs.text for u in updates)


def test_abort_frees_blocks_and_returns_the_partial_output(llm):
    engine = llm.llm_engine
    tok = llm.get_tokenizer()
    free_before = engine.block_manager.num_free_blocks
    engine.add_request(
        "abort-me", tok.encode(PROMPT), SamplingParams(temperature=0, max_tokens=50), stream=True
    )
    engine.step()
    engine.step()
    assert engine.block_manager.num_free_blocks < free_before
    output = engine.abort_request("abort-me")
    assert output.finished and output.outputs.finish_reason == "abort" and len(output.outputs.token_ids) == 2
    assert engine.block_manager.num_free_blocks == free_before
    assert not engine.has_unfinished_requests()
    assert engine.abort_request("abort-me") is None


class SplitAtParis(ReasoningParser):
    """Test parser: everything before the word "Paris" is reasoning."""

    tag = "Paris"

    def split(self, text, *, thinking_enabled, finished):
        if not thinking_enabled:
            return ReasoningSplit(None, text)
        index = text.find(self.tag)
        if index < 0:
            held = 0 if finished else partial_suffix_length(text, [self.tag])
            return ReasoningSplit(text[: len(text) - held], "")
        return ReasoningSplit(text[:index], text[index:])

    def reasoning_end_token_ids(self):
        return self.tokenizer.encode("\n\nEND", add_special_tokens=False)


@pytest.fixture
def parsing_llm(llm):
    engine = llm.llm_engine
    engine.reasoning_parser = SplitAtParis(engine.tokenizer)
    yield llm
    engine.reasoning_parser = None


def test_reasoning_split_fills_reasoning_content(parsing_llm):
    (output,) = parsing_llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert output.outputs.reasoning_content == " " and output.outputs.text.startswith("Paris.")
    (off,) = parsing_llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=16),
        use_tqdm=False,
        chat_template_kwargs={"enable_thinking": False},
    )
    assert off.outputs.reasoning_content is None and off.outputs.text == "The capital of France is Paris."


def test_reasoning_max_tokens_forces_the_end_sequence(parsing_llm):
    tok = parsing_llm.get_tokenizer()
    end = tok.encode("\n\nEND", add_special_tokens=False)
    plain = parsing_llm.generate(
        "Once upon a time", SamplingParams(temperature=0, max_tokens=10), use_tqdm=False
    )
    forced = parsing_llm.generate(
        "Once upon a time",
        SamplingParams(temperature=0, max_tokens=10, reasoning_max_tokens=3),
        use_tqdm=False,
    )
    plain_ids, forced_ids = plain[0].outputs.token_ids, forced[0].outputs.token_ids
    assert forced_ids[:3] == plain_ids[:3]
    assert forced_ids[3 : 3 + len(end)] == end


def test_partial_suffix_length():
    assert partial_suffix_length("abc</thi", ["</think>"]) == 5
    assert partial_suffix_length("abc</think>", ["</think>"]) == 0
    assert partial_suffix_length("x\n", ["\n\nThe", "zz"]) == 1
    assert partial_suffix_length("", ["ab"]) == 0


def break_passes(engine, monkeypatch, failing: set[int]) -> None:
    """Make the runner's passes numbered in `failing` (from 1) raise a simulated device fault."""
    real_execute = engine.runner.execute
    calls = {"count": 0}

    def execute(batch):
        calls["count"] += 1
        if calls["count"] in failing:
            raise RuntimeError("simulated device fault")
        return real_execute(batch)

    monkeypatch.setattr(engine.runner, "execute", execute)


def test_a_pass_that_fails_once_is_run_again_and_loses_nothing(llm, monkeypatch):
    """A transient fault: the batch's pass raises, each sequence's own pass then works; both
    requests go on with the tokens they get without the fault (fault isolation's retry)."""
    params = SamplingParams(temperature=0, max_tokens=5)
    expected = [o.outputs.token_ids for o in llm.generate([PROMPT, "Hello"], params, use_tqdm=False)]
    break_passes(llm.llm_engine, monkeypatch, {2})
    outputs = llm.generate([PROMPT, "Hello"], params, use_tqdm=False)
    assert [o.error_code for o in outputs] == [200, 200]
    assert [o.outputs.token_ids for o in outputs] == expected


def test_a_failing_forward_pass_fails_its_requests_and_the_engine_recovers(llm, monkeypatch):
    engine = llm.llm_engine
    # the batch's pass and both sequences' passes alone fail (the device probe, which does not
    # go through the runner, works: the device is fine, so only these requests fail)
    break_passes(engine, monkeypatch, {2, 3, 4})
    outputs = llm.generate([PROMPT, "Hello"], SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)
    assert [o.error_code for o in outputs] == [500, 500]
    assert all("simulated device fault" in o.error_msg and o.finished for o in outputs)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    again = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert again[0].error_code == 200 and again[0].outputs.text == " Paris."


def test_device_sampling_gets_each_sequences_settings_and_uniform(llm, monkeypatch):
    """A backend that samples on the device receives the rows it can serve; others stay on the host."""
    engine = llm.llm_engine
    calls = []

    def fake_device_sampler(logits, temperatures, top_k, top_p, uniforms):
        calls.append((temperatures.tolist(), top_k.tolist(), top_p.tolist(), uniforms.tolist()))
        return engine.backend.to_numpy(logits).argmax(axis=-1)

    backend_class = type(engine.backend)
    monkeypatch.setattr(
        backend_class, "capabilities", backend_class.capabilities | {Capability.DEVICE_SAMPLING}
    )
    monkeypatch.setattr(engine.backend, "sample_top_k_top_p", fake_device_sampler, raising=False)
    params = SamplingParams(temperature=0.5, top_k=-1, top_p=0.9, seed=11, max_tokens=3)
    (output,) = llm.generate(PROMPT, params, use_tqdm=False)
    expected_uniforms = np.random.default_rng([11, 0]).random(3).astype(np.float32).tolist()
    assert [c[3][0] for c in calls] == expected_uniforms
    assert calls[0][:3] == ([0.5], [0], [pytest.approx(0.9)])
    greedy = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert output.outputs.token_ids == greedy[0].outputs.token_ids  # the fake sampler takes the argmax
    calls.clear()
    llm.generate(
        PROMPT, SamplingParams(temperature=0.5, repetition_penalty=1.2, max_tokens=2), use_tqdm=False
    )
    assert calls == []  # penalties need the host sampler
