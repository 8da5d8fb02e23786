"""One assertion for generated tokens against reference tokens, prompt by prompt.

On a mismatch it names every prompt that differs (index and label), the first position where it
does, and both token windows around it: a bare list comparison of a dozen prompts' tokens says
neither at a glance. Importable from any test (pytest puts this directory on sys.path for
tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: tokens shown on each side of the first difference
CONTEXT = 3


def first_difference(ours: Sequence[int], theirs: Sequence[int]) -> int | None:
    """The first position where the two differ (the shorter one's length when it is a prefix of
    the other); None when they are equal."""
    for position, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return position
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def _name(index: int, labels: Sequence[Any] | None) -> str:
    return f"prompt {index}" if labels is None else f"prompt {index} ({labels[index]})"


def assert_tokens_match(
    got: Sequence[Sequence[int]], expected: Sequence[Sequence[int]], labels: Sequence[Any] | None = None
) -> None:
    """Each prompt's generated tokens `got[i]` equal its reference `expected[i]` (same count of
    prompts); `labels[i]` (a case name, say) is shown beside the index on failure."""
    assert len(got) == len(expected), f"{len(got)} generations for {len(expected)} references"
    assert labels is None or len(labels) == len(expected), "one label per prompt"
    failures = []
    for index, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        ours, theirs = list(ours), list(theirs)
        position = first_difference(ours, theirs)
        if position is None:
            continue
        start, stop = max(0, position - CONTEXT), position + CONTEXT + 1
        failures.append(
            f"{_name(index, labels)}: first difference at token {position} (of {len(ours)} generated, "
            f"{len(theirs)} expected); from token {start}: got {ours[start:stop]}, "
            f"expected {theirs[start:stop]}"
        )
    assert not failures, "generated tokens differ from the reference:\n" + "\n".join(failures)


def assert_outputs_match(
    outputs: Sequence[Any], expected: Sequence[Sequence[int]], labels: Sequence[Any] | None = None
) -> None:
    """`RequestOutput`s: each request succeeded (else its error message) and its first sample's
    tokens equal the reference, as `assert_tokens_match`."""
    for index, output in enumerate(outputs):
        assert output.error_code == 200, f"{_name(index, labels)}: {output.error_msg}"
    assert_tokens_match([output.outputs.token_ids for output in outputs], expected, labels)
