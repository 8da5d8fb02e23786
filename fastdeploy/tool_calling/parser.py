"""The tool-call parser interface: split a model's answer into its text content and its calls.

Parsers are registered by name through the `fastdeploy_tool_call_parsers` hook and chosen with
`--tool-call-parser NAME` (server) or `LLM(tool_call_parser=NAME)`; `ToolCallParser` is exported
by `fastdeploy.plugins.api`. Like reasoning parsers they are pure functions of the whole answer
generated so far, called again at every streamed step: `parse(text, finished)` returns the
content to show and the calls seen so far, and a later call with more text only ever extends
both (a longer content, more calls, longer arguments), so the differences are the stream's
deltas. While `finished` is False a parser holds back text that may still turn into a call.

A parser overrides `parse` (calls stream as they are written) or only `extract_tool_calls`
(FastDeploy's and vLLM's method: calls and content are then sent when the answer finishes).
"""

from __future__ import annotations

import json
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


class ToolCallParser:
    """Built once per engine (or server) with the model's tokenizer; see the module docstring."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.parse is ToolCallParser.parse and cls.extract_tool_calls is ToolCallParser.extract_tool_calls:
            raise TypeError(f"{cls.__name__} must override parse or extract_tool_calls")

    def parse(self, text: str, finished: bool) -> ParsedAnswer:
        """The content and calls of the answer text generated so far."""
        if not finished:
            return ParsedAnswer("")  # without a streaming parse, everything waits for the end
        extraction = self.extract_tool_calls(text)
        if not extraction.tools_called:
            return ParsedAnswer(text)
        drafts = [
            CallDraft(call["function"]["name"], call["function"]["arguments"], arguments_complete=True)
            for call in extraction.tool_calls
        ]
        return ParsedAnswer(extraction.content or "", drafts)

    def extract_tool_calls(self, text: str) -> ToolCallExtraction:
        """The calls of a finished answer (FastDeploy's and vLLM's parser method)."""
        parsed = self.parse(text, finished=True)
        calls = parsed.finished_calls()
        if not calls:
            return ToolCallExtraction(tools_called=False, content=text)
        return ToolCallExtraction(tools_called=True, tool_calls=calls, content=parsed.content or None)
