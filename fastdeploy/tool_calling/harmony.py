"""`openai` / `gpt-oss`: the tool-call parser name for GPT-OSS's harmony format.

Harmony writes each call as a message of its own (`to=functions.NAME` on the commentary
channel), apart from the answer, so the `gpt-oss` reasoning parser already takes the calls out
(see `fastdeploy.reasoning.harmony`) and the answer text it leaves holds none. This parser shows
that answer as it is; configuring it lets requests ask for `tool_choice="auto"`.
"""

from __future__ import annotations

from fastdeploy.tool_calling.parser import ParsedAnswer, ToolCallParser


class HarmonyToolParser(ToolCallParser):
    """The answer is all content; the calls come from the `gpt-oss` reasoning parser."""

    def parse(self, text: str, finished: bool) -> ParsedAnswer:
        return ParsedAnswer(text)
