"""Calls written as JSON objects between tags: Hermes / Qwen2.5 / Qwen3 and ERNIE-X1.

    Let me check.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": ..., "arguments": ...}
    </tool_call>

The content is the text before the first `<tool_call>` (without the whitespace that separates
it from the call); what follows the calls is not shown. A block whose body is not a call object
is skipped when the answer is finished.
"""

from __future__ import annotations

from fastdeploy.text_utils import partial_suffix_length
from fastdeploy.tool_calling.json_scan import scan_call
from fastdeploy.tool_calling.parser import ParsedAnswer, ToolCallParser

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


class TaggedJsonToolParser(ToolCallParser):
    """`<tool_call>{json}</tool_call>` blocks (the tags are class attributes for variants)."""

    start_tag = TOOL_CALL_START
    end_tag = TOOL_CALL_END

    def parse(self, text: str, finished: bool) -> ParsedAnswer:
        first = text.find(self.start_tag)
        if first < 0:
            if finished:
                return ParsedAnswer(text)
            # hold back what may become the tag, and the whitespace that would precede it
            held = partial_suffix_length(text, [self.start_tag])
            return ParsedAnswer(text[: len(text) - held].rstrip())
        parsed = ParsedAnswer(text[:first].rstrip())
        pos = first
        while pos >= 0:
            body = pos + len(self.start_tag)
            while body < len(text) and text[body] in " \t\r\n":
                body += 1
            if body >= len(text):
                break
            end = None
            if text[body] == "{":
                draft, end = scan_call(text, body)
                parsed.calls.append(draft)
            if end is None:
                close = text.find(self.end_tag, body)
                if close < 0:
                    break
                end = close
            pos = text.find(self.start_tag, end)
        return parsed


class HermesToolParser(TaggedJsonToolParser):
    """`hermes` / `qwen3`: Hermes-format calls, as Qwen2.5 and Qwen3 chat templates ask for."""


class ErnieX1TaggedToolParser(TaggedJsonToolParser):
    """`ernie-x1`: ERNIE-X1 writes the same blocks after its reasoning (see fastdeploy.reasoning.ernie_x1)."""
