"""Forced calls (`tool_choice` "required" or a named function): the grammar and the reading.

As in vLLM, a forced call does not rely on the model's own tool-call format: the constrained
decoder makes the answer JSON that is valid by construction, and these parsers read it.

- A named function: the answer is its arguments object, constrained to its `parameters` schema.
- "required": the answer is a non-empty JSON array of `{"name": <one of the tools>,
  "parameters": <that tool's arguments>}` objects.
"""

from __future__ import annotations

from typing import Any

from fastdeploy.engine.guided.params import GuidedDecodingParams
from fastdeploy.tool_calling.json_scan import CallDraft, container_end, scan_call
from fastdeploy.tool_calling.parser import ParsedAnswer, ToolCallParser


class NamedFunctionParser(ToolCallParser):
    """The whole answer is the arguments of one call to `name`."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def parse(self, text: str, finished: bool) -> ParsedAnswer:
        arguments = text.strip()
        complete = bool(arguments) and container_end(arguments, 0) == len(arguments)
        return ParsedAnswer("", [CallDraft(self.name, arguments, arguments_complete=complete)])


class RequiredCallsParser(ToolCallParser):
    """The answer is a JSON array of `{"name", "parameters"}` calls."""

    def parse(self, text: str, finished: bool) -> ParsedAnswer:
        parsed = ParsedAnswer("")
        pos = text.find("[")
        if pos < 0:
            return parsed
        pos += 1
        while True:
            pos = text.find("{", pos)
            if pos < 0:
                return parsed
            draft, end = scan_call(text, pos)
            parsed.calls.append(draft)
            if end is None:
                return parsed
            pos = end


def named_function_grammar(parameters: dict[str, Any]) -> GuidedDecodingParams:
    return GuidedDecodingParams(json=parameters)


def required_calls_grammar(functions: list[dict[str, Any]]) -> GuidedDecodingParams:
    """A non-empty array of calls to any of `functions` (OpenAI function dicts with parameters)."""
    choices = [
        {
            "type": "object",
            "properties": {"name": {"const": function["name"]}, "parameters": function["parameters"]},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for function in functions
    ]
    items = choices[0] if len(choices) == 1 else {"anyOf": choices}
    return GuidedDecodingParams(json={"type": "array", "minItems": 1, "items": items})
