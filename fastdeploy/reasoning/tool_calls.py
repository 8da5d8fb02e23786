"""ERNIE-X1 tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks.

ERNIE-X1 (and ERNIE-4.5 thinking models) answer a tool request after their reasoning with one or
more blocks

    </think>

    <tool_call>
    {"name": "get_weather", "arguments": {"location": "北京"}}
    </tool_call>

`extract_tool_calls` turns the complete blocks of a text into OpenAI-style tool calls
(`{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}`), as
FastDeploy's `ernie-x1` tool parser does. A block whose body is not a JSON object with a string
`name` is skipped with a warning; it never fails the request. The tool-call parser registered
under `ernie-x1` (for the server and `LLM.chat(tools=...)`) is in `fastdeploy.tool_calling.tagged`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastdeploy.logger import get_logger

logger = get_logger(__name__)

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)


def new_tool_call_id() -> str:
    """A fresh id, in the form FastDeploy gives its tool calls."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def tool_call(name: str, arguments: Any) -> dict[str, Any]:
    """One OpenAI-style tool call; `arguments` is serialised to JSON unless already a string."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": new_tool_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def extract_tool_calls(text: str) -> list[dict[str, Any]]:
    """The tool calls of every complete `<tool_call>...</tool_call>` block in `text`, in order."""
    calls = []
    for match in _BLOCK.finditer(text):
        body = match.group(1).strip()
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            logger.warning("skipping a <tool_call> block that is not JSON (%s): %.200s", exc, body)
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
            logger.warning("skipping a <tool_call> block without a string 'name': %.200s", body)
            continue
        calls.append(tool_call(data["name"], data.get("arguments", {})))
    return calls


@dataclass
class ToolCallExtraction:
    """What a tool-call parser found: the calls, and the text left for `content`."""

    tools_called: bool
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    content: str | None = None
