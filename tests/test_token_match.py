"""tests/token_match.py: the shared assertion for generated tokens fails exactly when a prompt's
tokens differ from its reference, and its message locates the difference."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from token_match import assert_outputs_match, assert_tokens_match, first_difference


@pytest.mark.parametrize(
    ("ours", "theirs", "position"),
    [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 5, 3], 1), ([1, 2], [1, 2, 3], 2), ([], [4], 0)],
)
def test_first_difference(ours, theirs, position):
    assert first_difference(ours, theirs) == position


def test_equal_tokens_pass():
    assert_tokens_match([[1, 2], [3]], [[1, 2], [3]], labels=["a", "b"])


def test_the_message_names_each_differing_prompt_the_position_and_both_windows():
    got = [[1, 2, 3], list(range(10)), [7, 8]]
    expected = [[1, 2, 3], [0, 1, 2, 3, 4, 5, 99, 7, 8, 9], [7, 8, 9]]
    with pytest.raises(AssertionError) as failure:
        assert_tokens_match(got, expected, labels=["first", "second", "third"])
    message = str(failure.value)
    assert "prompt 0" not in message
    assert (
        "prompt 1 (second): first difference at token 6 (of 10 generated, 10 expected); "
        "from token 3: got [3, 4, 5, 6, 7, 8, 9], expected [3, 4, 5, 99, 7, 8, 9]"
    ) in message
    assert "prompt 2 (third): first difference at token 2 (of 2 generated, 3 expected)" in message


def test_a_different_count_of_prompts_fails():
    with pytest.raises(AssertionError, match="1 generations for 2 references"):
        assert_tokens_match([[1]], [[1], [2]])


def test_a_failed_request_is_reported_with_its_error():
    ok = SimpleNamespace(error_code=200, error_msg="", outputs=SimpleNamespace(token_ids=[1, 2]))
    failed = SimpleNamespace(
        error_code=400, error_msg="prompt too long", outputs=SimpleNamespace(token_ids=[])
    )
    assert_outputs_match([ok], [[1, 2]])
    with pytest.raises(AssertionError, match=r"prompt 1 \(b\): prompt too long"):
        assert_outputs_match([ok, failed], [[1, 2], []], labels=["a", "b"])
