"""Text read only at the end (plain generate) equals text built token by token (stop strings, streams).

A stand-in model runner makes every sequence emit a fixed text with multi-token characters
(emoji, CJK, accents), so the detokenizer's held-back tails are exercised on every path.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy import SamplingParams
from fastdeploy.model_executor.model_runner import build_layout

TEXT = "Gutenberg's press 🙂 changed Europe. 活字印刷术 — café 📚🤖 done."
NEVER = ["\x00never"]  # a stop string that never matches: text is then built every step


class ScriptedRunner:
    """Instead of a forward pass, logits that make sequence k emit script[k + i] as its i-th token."""

    def __init__(self, runner, script: list[int], vocab_size: int) -> None:
        self.block_size = runner.block_size
        self.script = script
        self.vocab_size = vocab_size

    def execute(self, batch):
        layout, sampling = build_layout(batch, self.block_size)
        logits = np.zeros((len(sampling), self.vocab_size), dtype=np.float32)
        for row, index in enumerate(sampling):
            seq = batch.seqs[index]
            logits[row, self.script[(seq.sample_index + seq.num_output_tokens) % len(self.script)]] = 1.0
        return logits, sampling, 0.0


@pytest.fixture
def scripted(llm, monkeypatch):
    engine = llm.llm_engine
    script = llm.get_tokenizer().encode(TEXT, add_special_tokens=False)
    monkeypatch.setattr(
        engine, "runner", ScriptedRunner(engine.runner, script, engine.model_config.vocab_size)
    )
    return llm, script


def drain(engine, request_id: str):
    updates = []
    while engine.has_unfinished_requests():
        updates.extend(output for output in engine.step() if output.request_id == request_id)
    return updates


@pytest.mark.parametrize("max_tokens", [5, 6, 7, 17, 40])
def test_generate_text_equals_token_by_token_text_and_full_decode(scripted, max_tokens):
    llm, script = scripted
    tokenizer = llm.get_tokenizer()
    prompt = {"prompt_token_ids": [1, 2, 3]}
    base = {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True, "n": 2}
    (deferred,) = llm.generate(prompt, SamplingParams(**base), use_tqdm=False)
    (eager,) = llm.generate(prompt, SamplingParams(**base, stop=NEVER), use_tqdm=False)
    engine = llm.llm_engine
    engine.add_request("streamed", [1, 2, 3], SamplingParams(**base), stream=True)
    streamed = drain(engine, "streamed")[-1]
    for index in range(2):
        ids = deferred.outputs[index].token_ids
        assert ids == [script[(index + i) % len(script)] for i in range(max_tokens)]
        assert eager.outputs[index].token_ids == ids == streamed.outputs[index].token_ids
        expected = tokenizer.decode(ids)
        assert deferred.outputs[index].text == expected
        assert eager.outputs[index].text == expected
        assert streamed.outputs[index].text == expected


def test_only_plain_requests_defer_their_text(scripted):
    llm, _ = scripted
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=3)
    engine.add_request("plain", [1, 2], params)
    engine.add_request("stop", [1, 2], SamplingParams(temperature=0, max_tokens=3, stop=NEVER))
    engine.add_request("stream", [1, 2], params, stream=True)
    deferred = {request_id: engine.requests[request_id].seqs[0].defer_text for request_id in engine.requests}
    drain(engine, "")
    assert deferred == {"plain": True, "stop": False, "stream": False}


def test_abort_returns_the_same_partial_text_either_way(scripted):
    """Aborted after the first bytes of the emoji: both hold the incomplete character back."""
    llm, script = scripted
    tokenizer = llm.get_tokenizer()
    emoji_start = next(i for i in range(len(script)) if "\ufffd" in tokenizer.decode(script[: i + 1]))
    engine = llm.llm_engine
    params = {"temperature": 0, "max_tokens": 50, "ignore_eos": True}
    engine.add_request("plain", [1, 2], SamplingParams(**params))
    engine.add_request("stop", [1, 2], SamplingParams(**params, stop=NEVER))
    for _ in range(emoji_start + 1):
        engine.step()
    plain, stop = engine.abort_request("plain"), engine.abort_request("stop")
    assert plain.outputs.token_ids == stop.outputs.token_ids == script[: emoji_start + 1]
    assert plain.outputs.text == stop.outputs.text == tokenizer.decode(script[:emoji_start])


def test_plain_generate_decodes_a_few_times_per_sequence_not_per_token(scripted, monkeypatch):
    llm, _ = scripted
    tokenizer = llm.llm_engine.tokenizer
    calls = []
    decode = tokenizer.decode
    monkeypatch.setattr(
        tokenizer, "decode", lambda ids, **kwargs: calls.append(len(ids)) or decode(ids, **kwargs)
    )
    params = {"temperature": 0, "max_tokens": 40, "ignore_eos": True}
    llm.generate({"prompt_token_ids": [1, 2]}, SamplingParams(**params), use_tqdm=False)
    deferred_calls, calls[:] = len(calls), []
    llm.generate({"prompt_token_ids": [1, 2]}, SamplingParams(**params, stop=NEVER), use_tqdm=False)
    assert deferred_calls <= 8 and len(calls) >= 40
