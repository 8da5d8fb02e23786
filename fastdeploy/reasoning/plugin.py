"""The built-in reasoning parsers, registered through the `fastdeploy.plugins` entry point.

Names are those FastDeploy users pass: `reasoning_parser="ernie-45-vl" | "ernie-x1" | "gpt-oss" | "harmony" | "qwen3"`.
The tool-call parsers register from `fastdeploy/tool_calling/plugin.py`.
"""

from __future__ import annotations

from fastdeploy.plugins.hookspecs import hookimpl
from fastdeploy.reasoning.ernie_x1 import ErnieX1ReasoningParser
from fastdeploy.reasoning.harmony import HarmonyReasoningParser
from fastdeploy.reasoning.think_parser import ErnieVLReasoningParser, Qwen3ReasoningParser


@hookimpl
def fastdeploy_reasoning_parsers() -> dict[str, type]:
    return {
        "ernie-45-vl": ErnieVLReasoningParser,
        "ernie-x1": ErnieX1ReasoningParser,
        "gpt-oss": HarmonyReasoningParser,
        "harmony": HarmonyReasoningParser,
        "qwen3": Qwen3ReasoningParser,
    }
