"""The built-in reasoning and tool-call parsers, registered through the `fastdeploy.plugins` entry point.

Names are those FastDeploy users pass: `reasoning_parser="ernie-45-vl" | "ernie-x1" | "qwen3"`
and, for the server and `LLM(tool_call_parser=...)`, `ernie-x1`, `hermes` and `qwen3` (Hermes-style
`<tool_call>` blocks, as Qwen2.5 and Qwen3 write them).
"""

from __future__ import annotations

from fastdeploy.plugins.hookspecs import hookimpl
from fastdeploy.reasoning.ernie_x1 import ErnieX1ReasoningParser
from fastdeploy.reasoning.think_parser import ErnieVLReasoningParser, Qwen3ReasoningParser
from fastdeploy.tool_calling.tagged import ErnieX1TaggedToolParser, HermesToolParser


@hookimpl
def fastdeploy_reasoning_parsers() -> dict[str, type]:
    return {
        "ernie-45-vl": ErnieVLReasoningParser,
        "ernie-x1": ErnieX1ReasoningParser,
        "qwen3": Qwen3ReasoningParser,
    }


@hookimpl
def fastdeploy_tool_call_parsers() -> dict[str, type]:
    return {"ernie-x1": ErnieX1TaggedToolParser, "hermes": HermesToolParser, "qwen3": HermesToolParser}
