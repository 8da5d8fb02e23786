"""Constraints past the grammar engine's limits: the request fails alone with error_code 400
naming the engine's reason (never a 200 whose text breaks the constraint), its batch finishes,
and the error never repeats the whole constraint."""

from __future__ import annotations

import pytest

from fastdeploy import GuidedDecodingParams, SamplingParams
from fastdeploy.engine.guided.backend import GrammarBackend, GrammarMatcher
from fastdeploy.engine.guided.decoder import GuidedDecoder
from fastdeploy.engine.guided.params import MAX_CHOICES, GuidedDecodingError

#: a grammar whose first token already needs more Earley items than llguidance allows
#: ("(" opens an `a`, which may be a `b`, which is an `a` again: unbounded left context)
RUNAWAY = 'root ::= a\na ::= "(" a ")" | b\nb ::= a'
ASK = [{"role": "user", "content": "Give me a short code."}]


def test_a_grammar_the_engine_gives_up_on_fails_its_request_alone(llm):
    plain = SamplingParams(temperature=0, max_tokens=8)
    runaway = SamplingParams(
        temperature=0, max_tokens=8, guided_decoding=GuidedDecodingParams(grammar=RUNAWAY)
    )
    (alone,) = llm.chat(ASK, plain, use_tqdm=False)
    before, failed, after = llm.chat([ASK] * 3, [plain, runaway, plain], use_tqdm=False)
    assert failed.error_code == 400
    assert "guided decoding could not go on after 0 constrained tokens" in failed.error_msg
    assert "Too many items" in failed.error_msg  # llguidance's reason, one line of it
    assert "<grammar>" not in failed.error_msg and len(failed.error_msg) < 600
    for output in (before, after):
        assert output.error_code == 200 and output.outputs.token_ids == alone.outputs.token_ids
    assert not llm.llm_engine.guided.active  # the failed request's matcher was released


def test_choice_lists_are_bounded_and_errors_do_not_repeat_them():
    with pytest.raises(
        GuidedDecodingError, match=f"{MAX_CHOICES + 1} choices are too many: at most {MAX_CHOICES}"
    ):
        GuidedDecodingParams(choice=["yes"] * (MAX_CHOICES + 1))
    with pytest.raises(GuidedDecodingError) as info:
        GuidedDecodingParams(choice=["a", "b", 3] + ["c"] * 500)
    assert str(info.value).endswith("item 2 is a int") and len(str(info.value)) < 200


class _Matcher(GrammarMatcher):
    def __init__(self, error: str | None) -> None:
        self._error = error

    def accept_token(self, token_id: int) -> bool:
        return True

    def rollback(self, num_tokens: int) -> None:
        pass

    def is_terminated(self) -> bool:
        return False

    @property
    def error(self) -> str | None:
        return self._error


class _MaskFailsBackend(GrammarBackend):
    """A backend whose matchers fail when asked for their first mask, as llguidance's do for
    a grammar past its symbol limit (after a panic in its parser)."""

    name = "mask-fails"
    filled = 0

    def compile(self, params):
        return "compiled"

    def matcher(self, compiled):
        return _Matcher(None)

    def fill_bitmasks(self, matchers, bitmask):
        self.filled += 1
        for matcher in matchers:
            matcher._error = "Stop: ParserTooComplex\nError: panic: too many symbols\n<grammar>huge</grammar>"


def test_a_constraint_whose_first_mask_fails_is_refused_when_compiled(llm):
    decoder = GuidedDecoder("llguidance", llm.get_tokenizer(), 64, [0])
    decoder._backend = _MaskFailsBackend(type("Table", (), {"vocab_size": 64})())
    with pytest.raises(
        GuidedDecodingError, match=r"too complex for the grammar engine: panic: too many symbols$"
    ):
        decoder.compile(GuidedDecodingParams(regex="a+"))
    assert decoder._backend.filled == 1
