"""The built-in reasoning and tool-call parsers, registered through the `fastdeploy.plugins` entry point.

Names are those FastDeploy users pass: `reasoning_parser="ernie-45-vl" | "ernie-x1" | "qwen3"`,
and FastDeploy's tool-call parser name `ernie-x1`.
"""

from __future__ import annotations

from fastdeploy.plugins.hookspecs import hookimpl
from fastdeploy.reasoning.ernie_x1 import ErnieX1ReasoningParser
from fastdeploy.reasoning.think_parser import ErnieVLReasoningParser, Qwen3ReasoningParser
from fastdeploy.reasoning.tool_calls import ErnieX1ToolParser


@hookimpl
def fastdeploy_reasoning_parsers() -> dict[str, type]:
    return {
        "ernie-45-vl": ErnieVLReasoningParser,
        "ernie-x1": ErnieX1ReasoningParser,
        "qwen3": Qwen3ReasoningParser,
    }


@hookimpl
def fastdeploy_tool_call_parsers() -> dict[str, type]:
    return {"ernie-x1": ErnieX1ToolParser}
