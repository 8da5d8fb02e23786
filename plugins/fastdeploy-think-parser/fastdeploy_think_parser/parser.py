"""`think-tags`: reasoning is an explicit `<think> ... </think>` block at the start of the output.

Unlike parsers for templates that open the block in the prompt, this one needs the model to
write `<think>` itself; output without it is all answer. The engine calls `split` on the whole
text at every streamed step, so a split of a prefix must be a prefix of the later split: while
the output is unfinished, a trailing fragment that may still become a tag, and trailing
newlines of the reasoning (dropped if `</think>` follows), are held back.
"""

from __future__ import annotations

from fastdeploy.plugins.api import ReasoningParser, ReasoningSplit

OPEN, CLOSE = "<think>", "</think>"


def _partial_tag_length(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that `text` ends with."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


class ThinkTagsParser(ReasoningParser):
    """Splits `<think>reasoning</think>answer`; text without an opening `<think>` is the answer."""

    def split(self, text: str, *, thinking_enabled: bool, finished: bool) -> ReasoningSplit:
        stripped = text.lstrip()
        if not stripped.startswith(OPEN):
            if not finished and OPEN.startswith(stripped):
                return ReasoningSplit(None, "")  # may still become "<think>"
            return ReasoningSplit(None, text)
        body = stripped[len(OPEN) :]
        end = body.find(CLOSE)
        if end >= 0:
            return ReasoningSplit(body[:end].strip("\n"), body[end + len(CLOSE) :].lstrip("\n"))
        if not finished:
            body = body[: len(body) - _partial_tag_length(body, CLOSE)]
        return ReasoningSplit(body.lstrip("\n").rstrip("\n"), "")

    def reasoning_end_token_ids(self) -> list[int] | None:
        """The tokens of `</think>`, forced when `reasoning_max_tokens` runs out."""
        return self.tokenizer.encode(CLOSE, add_special_tokens=False) or None
