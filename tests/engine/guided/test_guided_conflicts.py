"""Bans that leave a constrained sample no token (bad_words, stop_token_ids before min_tokens):
that request fails alone with error_code 400 naming the settings, the rest of its batch finishes."""

from __future__ import annotations

import re

import numpy as np

from fastdeploy import GuidedDecodingParams, SamplingParams
from fastdeploy.engine.guided.backend import bitmask_words
from fastdeploy.engine.guided.conflicts import conflict
from fastdeploy.engine.sampler import BannedTokens

ASK = [{"role": "user", "content": "Give me a short code."}]
DIGITS = list("0123456789")


def _token(llm, text: str) -> int:
    (token,) = llm.get_tokenizer().encode(text, add_special_tokens=False)
    return token


def test_one_conflicting_request_fails_alone_in_a_mixed_batch(llm):
    x = _token(llm, "x")
    plain_greedy = SamplingParams(temperature=0, max_tokens=16)
    plain_sampled = SamplingParams(temperature=0.8, seed=5, n=2, max_tokens=16)
    phone = SamplingParams(
        temperature=0, max_tokens=16, guided_decoding=GuidedDecodingParams(regex=r"[0-9]{3}")
    )
    good = [plain_greedy, plain_sampled, phone]
    alone = [llm.chat(ASK, params, use_tqdm=False)[0] for params in good]
    conflicting = {
        # greedy, at the first token: the grammar allows only "x", bad_words bans it
        "bad_words": SamplingParams(
            temperature=0, max_tokens=8, bad_words=["x"], guided_decoding=GuidedDecodingParams(choice=["x"])
        ),
        # sampled, after one token: the grammar allows only digits, bad_words bans them all
        "digits": SamplingParams(
            temperature=0.8,
            seed=1,
            max_tokens=8,
            bad_words=DIGITS,
            guided_decoding=GuidedDecodingParams(regex="x[0-9]"),
        ),
        # sampled: "x" is a stop token, banned until min_tokens
        "stop_token_ids": SamplingParams(
            temperature=0.7,
            seed=2,
            max_tokens=8,
            min_tokens=3,
            stop_token_ids=[x],
            guided_decoding=GuidedDecodingParams(choice=["x"]),
        ),
    }
    params = [
        good[0],
        conflicting["bad_words"],
        good[1],
        conflicting["digits"],
        good[2],
        conflicting["stop_token_ids"],
    ]
    outputs = llm.chat([ASK] * len(params), params, use_tqdm=False)

    for output, reference in zip(outputs[0::2], alone, strict=True):
        assert output.error_code == 200, output.error_msg
        got = [sample.token_ids for sample in output.outputs]
        assert got == [sample.token_ids for sample in reference.outputs]
    assert re.fullmatch("[0-9]{3}", outputs[4].outputs.text)

    bad_words, digits, stop = outputs[1], outputs[3], outputs[5]
    assert [bad_words.error_code, digits.error_code, stop.error_code] == [400, 400, 400]
    assert "after 0 output tokens" in bad_words.error_msg
    assert f"'x' (id {x})" in bad_words.error_msg and "bad_words ['x'] bans it" in bad_words.error_msg
    assert "min_tokens" not in bad_words.error_msg and "stop_token_ids" not in bad_words.error_msg
    assert digits.outputs.token_ids == [x] and "after 1 output token " in digits.error_msg
    assert f"'7' (id {_token(llm, '7')})" in digits.error_msg and "and 2 more" in digits.error_msg
    assert f"stop_token_ids [{x}] (before min_tokens=3) bans it" in stop.error_msg
    assert not llm.llm_engine.guided.active  # the failed requests' matchers were released


def test_min_tokens_yields_to_a_complete_grammar(llm):
    """EOS stays banned before min_tokens while the grammar may go on, and is allowed once the
    grammar can only end (the documented choice), so min_tokens alone never conflicts."""
    params = SamplingParams(
        temperature=0,
        max_tokens=8,
        min_tokens=4,
        guided_decoding=GuidedDecodingParams(choice=["x", "x x x x"]),
    )
    (output,) = llm.chat(ASK, params, use_tqdm=False)
    assert output.error_code == 200 and output.outputs.text == "x x x x"
    short = SamplingParams(
        temperature=0, max_tokens=8, min_tokens=4, guided_decoding=GuidedDecodingParams(choice=["x"])
    )
    (output,) = llm.chat(ASK, short, use_tqdm=False)
    assert output.error_code == 200 and output.outputs.text == "x"


def _row(allowed: list[int], vocab: int) -> np.ndarray:
    words = np.zeros(bitmask_words(vocab), dtype=np.uint32)
    for token in allowed:
        words[token // 32] |= np.uint32(1 << (token % 32))
    return words.view(np.int32)


def test_conflict_names_only_the_settings_that_ban_allowed_tokens():
    reasons = {
        "min_tokens=2 (no EOS before that)": [0],
        "bad_words ['a']": [5],
        "stop_token_ids [40] (x)": [40],
    }
    ban = BannedTokens(0, [0, 5, 40], reasons)
    why = conflict(_row([5, 40], 70), 70, ban, 3, lambda token: f"<{token}>")
    assert why is not None and why.startswith(
        "after 3 output tokens the guided_decoding constraint allows only"
    )
    assert "<5> (id 5), <40> (id 40)" in why
    assert "bad_words ['a'] and stop_token_ids [40] (x) ban all of them" in why and "min_tokens" not in why
    assert conflict(_row([5, 41], 70), 70, ban, 3, str) is None  # 41 is left
    assert conflict(_row([], 70), 70, ban, 3, str) is None  # an empty grammar mask is not the bans' doing
