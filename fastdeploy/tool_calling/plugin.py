"""The built-in tool-call parsers, registered through the `fastdeploy.plugins` entry point.

Names are those the server and `LLM(tool_call_parser=...)` take: `ernie-x1`, `hermes` and `qwen3`
(Hermes-style `<tool_call>` blocks, as Qwen2.5 and Qwen3 write them), `openai` / `gpt-oss` (harmony).
"""

from __future__ import annotations

from fastdeploy.plugins.hookspecs import hookimpl
from fastdeploy.tool_calling.harmony import HarmonyToolParser
from fastdeploy.tool_calling.tagged import ErnieX1TaggedToolParser, HermesToolParser


@hookimpl
def fastdeploy_tool_call_parsers() -> dict[str, type]:
    return {
        "ernie-x1": ErnieX1TaggedToolParser,
        "gpt-oss": HarmonyToolParser,
        "hermes": HermesToolParser,
        "openai": HarmonyToolParser,
        "qwen3": HermesToolParser,
    }
