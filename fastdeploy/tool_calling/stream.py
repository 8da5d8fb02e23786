"""OpenAI `delta.tool_calls` from successive parses of one streamed sample.

Each call is announced once its name is known, in OpenAI's order: a first delta with `index`,
`id`, `type` and `function.name` (arguments ""), then deltas of `function.arguments` fragments
as the arguments' text grows. The fragments concatenate to the final arguments, which is what
the `openai` client's stream accumulation does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastdeploy.reasoning.tool_calls import new_tool_call_id
from fastdeploy.tool_calling.parser import ToolCallParser


@dataclass
class _SentCall:
    id: str
    arguments: str = ""


@dataclass
class ToolStreamDelta:
    """What one update adds: content text and tool-call deltas."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class ToolCallStream:
    """Per-sample memory of the content and calls already streamed."""

    def __init__(self, parser: ToolCallParser) -> None:
        self.parser = parser
        self._content = ""
        self._calls: list[_SentCall] = []

    @property
    def called(self) -> bool:
        """Whether any call has been streamed (the finish_reason becomes "tool_calls")."""
        return bool(self._calls)

    def update(self, text: str, finished: bool) -> ToolStreamDelta:
        """The delta for the sample's answer `text` so far."""
        parsed = self.parser.parse(text, finished)
        delta = ToolStreamDelta()
        if parsed.content.startswith(self._content):
            delta.content = parsed.content[len(self._content) :]
            self._content = parsed.content
        for index, draft in enumerate(parsed.calls):
            if draft.name is None:
                break  # calls are announced in order, each once its name is known
            if index == len(self._calls):
                self._calls.append(_SentCall(new_tool_call_id()))
                delta.tool_calls.append(
                    {
                        "index": index,
                        "id": self._calls[index].id,
                        "type": "function",
                        "function": {"name": draft.name, "arguments": ""},
                    }
                )
            sent = self._calls[index]
            if draft.arguments_quoted and not draft.arguments_complete:
                continue
            if len(draft.arguments) > len(sent.arguments) and draft.arguments.startswith(sent.arguments):
                fragment = draft.arguments[len(sent.arguments) :]
                sent.arguments = draft.arguments
                delta.tool_calls.append({"index": index, "function": {"arguments": fragment}})
        return delta
