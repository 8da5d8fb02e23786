"""The tool-call parser interface: split a model's answer into its text content and its calls.

Parsers are registered by name through the `fastdeploy_tool_call_parsers` hook and chosen with
`--tool-call-parser NAME` (server) or `LLM(tool_call_parser=NAME)`. Like reasoning parsers they
are pure functions of the whole answer generated so far, called again at every streamed step:
`parse(text, finished)` returns the content to show and the calls seen so far, and a later call
with more text only ever extends both (a longer content, more calls, longer arguments), so the
differences are the stream's deltas. While `finished` is False a parser holds back text that
may still turn into a call's opening tag.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from fastdeploy.logger import get_logger
from fastdeploy.reasoning.tool_calls import ToolCallExtraction, tool_call
from fastdeploy.tool_calling.json_scan import CallDraft

logger = get_logger(__name__)


@dataclass
class ParsedAnswer:
    """An answer split into its content and its tool calls (complete or still being written)."""

    content: str
    calls: list[CallDraft] = field(default_factory=list)

    def finished_calls(self) -> list[dict[str, Any]]:
        """OpenAI-style calls of the complete drafts whose arguments are valid JSON."""
        calls = []
        for draft in self.calls:
            arguments = draft.arguments if draft.arguments_complete else ""
            try:
                json.loads(arguments)
            except json.JSONDecodeError:
                logger.warning("dropping a tool call whose arguments are not JSON: %.200r", draft)
                continue
            if draft.name:
                calls.append(tool_call(draft.name, arguments))
        return calls


class ToolParser(ABC):
    """Built once per engine (or server) with the model's tokenizer."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    @abstractmethod
    def parse(self, text: str, finished: bool) -> ParsedAnswer:
        """The content and calls of the answer text generated so far."""

    def extract_tool_calls(self, text: str) -> ToolCallExtraction:
        """The calls of a finished answer (FastDeploy's and vLLM's parser method)."""
        parsed = self.parse(text, finished=True)
        calls = parsed.finished_calls()
        if not calls:
            return ToolCallExtraction(tools_called=False, content=text)
        return ToolCallExtraction(tools_called=True, tool_calls=calls, content=parsed.content or None)
