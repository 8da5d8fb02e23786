"""The reasoning-parser interface: split a model's output into its reasoning and its answer.

Parsers are registered by name through the `fastdeploy_reasoning_parsers` hook and chosen with
`LLM(..., reasoning_parser=name)`. The engine re-parses a sequence's whole text whenever it
builds an output (each streamed step and the final one), so a parser is a pure function of the
text: tags split across tokens need no state, and `finished=False` lets a parser hold back a
trailing fragment that may still become a tag.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from fastdeploy.input.tokenizer import Tokenizer


@dataclass(frozen=True)
class ReasoningSplit:
    """`reasoning_content` (None when the output has no reasoning part) and the answer `content`.

    Parsers of formats that put tool calls in the answer (ERNIE-X1's `<tool_call>` blocks) also
    fill `tool_calls` (OpenAI-style dicts: id, type "function", function {name, arguments}),
    once the output is finished; None when there are none.
    """

    reasoning_content: str | None
    content: str
    tool_calls: list[dict] | None = None


class ReasoningParser(ABC):
    """Built with the model's tokenizer once per engine."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    @abstractmethod
    def split(self, text: str, *, thinking_enabled: bool, finished: bool) -> ReasoningSplit:
        """Split the full output text generated so far.

        `thinking_enabled` is False when the request turned thinking off
        (`chat_template_kwargs={"enable_thinking": False}`): then the whole text is the answer
        unless the model still wrote an explicit reasoning block. While `finished` is False the
        parser may leave out a trailing partial tag (e.g. "</thi"), which a later call resolves.
        """

    def split_output(
        self, token_ids: Sequence[int], text: str, *, thinking_enabled: bool, finished: bool
    ) -> ReasoningSplit:
        """Split a sample given its generated ids too (what the engine calls).

        Formats whose structure lies in special tokens, which `text` leaves out (harmony's
        channels), override this to decode the ids themselves; the default splits `text`.
        """
        return self.split(text, thinking_enabled=thinking_enabled, finished=finished)

    def reasoning_end_token_ids(self) -> list[int] | None:
        """Tokens that close the reasoning part (forced when `reasoning_max_tokens` runs out)."""
        return None
