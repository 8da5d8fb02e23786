"""Both grammar backends accept exactly the texts their constraint allows, token by token on the
embedded model's tokenizer, and allow EOS only where the constraint can end. xgrammar is
optional (it needs torch and transformers): its cases are skipped when it is not installed."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from fastdeploy.engine.guided.backend import allowed_tokens, bitmask_words
from fastdeploy.engine.guided.decoder import GuidedDecoder
from fastdeploy.engine.guided.params import GuidedDecodingError, GuidedDecodingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
    },
    "required": ["name"],
    "additionalProperties": False,
}
TAG = {
    "structures": [
        {
            "begin": "<call=f>",
            "schema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
            "end": "</call>",
        }
    ],
    "triggers": ["<call="],
}
#: (constraint, texts it allows, texts it does not allow, complete or not)
CASES = [
    (
        {"json": SCHEMA},
        ['{"name": "Ann", "tags": [1, 2]}', '{"name":"Bo"}'],
        ['{"name": 3}', '{"tags": []}', '{"name": "x", "age": 1}'],
    ),
    ({"regex": r"[0-9]{3}-[a-z]+"}, ["123-abc", "000-z"], ["12-abc", "123-ABC", "123-"]),
    ({"choice": ["yes", "no way"]}, ["yes", "no way"], ["no", "yes!", "maybe"]),
    ({"grammar": 'start: "x=" NUM\nNUM: /[1-9][0-9]*/'}, ["x=1", "x=905"], ["x=0", "y=1", "x="]),
    ({"grammar": 'root ::= "x=" [1-9] [0-9]*'}, ["x=7"], ["x=07"]),
    ({"json_object": True}, ['{"any": [1, {"thing": null}]}'], ["[1, 2]", '"text"']),
    (
        {"structural_tag": TAG},
        ['Sure. <call=f>{"x": 4}</call> done', "no calls at all"],
        ['<call=f>{"x": "4"}</call>'],
    ),
]
BACKENDS = [
    "llguidance",
    pytest.param(
        "xgrammar",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("xgrammar") is None, reason="xgrammar is not installed"
        ),
    ),
]


@pytest.fixture(scope="module", params=BACKENDS)
def decoder(request, llm):
    engine = llm.llm_engine
    return GuidedDecoder(
        request.param, engine.tokenizer, engine.model_config.vocab_size, sorted(engine.eos_token_ids)
    )


def walk(decoder, compiled, text: str) -> bool:
    """Whether the matcher accepts every token of `text` and may end after it."""
    matcher = decoder.backend.matcher(compiled)
    bitmask = np.zeros((1, bitmask_words(decoder.vocab_size)), dtype=np.int32)
    for token in decoder.tokenizer.encode(text, add_special_tokens=False):
        decoder.backend.fill_bitmasks([matcher], bitmask)
        if not allowed_tokens(bitmask[0], decoder.vocab_size)[token] or not matcher.accept_token(token):
            return False
    decoder.backend.fill_bitmasks([matcher], bitmask)
    return bool(allowed_tokens(bitmask[0], decoder.vocab_size)[decoder.eos_token_ids].all())


@pytest.mark.parametrize(("constraint", "good", "bad"), CASES, ids=[next(iter(c[0])) for c in CASES])
def test_backend_allows_exactly_the_language(decoder, constraint, good, bad):
    compiled = decoder.compile(GuidedDecodingParams(**constraint))
    for text in good:
        assert walk(decoder, compiled, text), f"{decoder.backend_name} refused {text!r}"
    for text in bad:
        assert not walk(decoder, compiled, text), f"{decoder.backend_name} allowed {text!r}"


def test_rollback_returns_to_an_earlier_state(decoder):
    compiled = decoder.compile(GuidedDecodingParams(choice=["abc", "abd"]))
    matcher = decoder.backend.matcher(compiled)
    tokens = decoder.tokenizer.encode("abc", add_special_tokens=False)
    assert all(matcher.accept_token(t) for t in tokens)
    matcher.rollback(len(tokens))
    assert all(matcher.accept_token(t) for t in decoder.tokenizer.encode("abd", add_special_tokens=False))


def test_invalid_regex_names_the_field(decoder):
    with pytest.raises(GuidedDecodingError) as info:
        decoder.compile(GuidedDecodingParams(regex="(unclosed"))
    assert info.value.field == "regex"
