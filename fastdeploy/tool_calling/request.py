"""A request's `tools` and `tool_choice`, checked, and what they mean for generation.

`tool_choice` is OpenAI's: "none" (the model answers in text; the tools still reach the chat
template), "auto" (the model may call; the configured tool-call parser reads its calls),
"required" (at least one call) or `{"type": "function", "function": {"name": ...}}` (exactly that
call). Left out, it is "auto" when tools are given and a tool-call parser is configured, and
"none" otherwise (the tools are still rendered into the prompt, as vLLM's offline `chat` does).
Forced calls use the constrained decoder (see `forced`), so they work without a parser; an
explicit "auto" needs one.

Errors raise `ToolRequestError` with `param` set to the request field at fault ("tools" or
"tool_choice"), which the server answers with a 400 and `LLM.chat` with `error_code` 400.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastdeploy.engine.guided.params import GuidedDecodingParams
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.tool_calling.forced import (
    NamedFunctionParser,
    RequiredCallsParser,
    named_function_grammar,
    required_calls_grammar,
)
from fastdeploy.tool_calling.parser import ToolCallParser

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_MODES = ("none", "auto", "required")


class ToolRequestError(InvalidArgumentError):
    """Invalid `tools` / `tool_choice`; `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ToolPlan:
    """How to generate and read one chat request with tools."""

    #: "none", "auto", "required" or "named"
    mode: str
    #: the tools as the chat template receives them (None when the request has none)
    tools: list[dict[str, Any]] | None
    #: the constraint of a forced call (None for "none" and "auto")
    guided_decoding: GuidedDecodingParams | None = None
    #: reads the answer (None: the answer is plain text)
    parser: ToolCallParser | None = None

    @property
    def calls_tools(self) -> bool:
        return self.parser is not None


def _function(index: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise ToolRequestError("tools", f"{where} must be an object, got {type(tool).__name__}")
    if tool.get("type", "function") != "function":
        raise ToolRequestError("tools", f"{where}.type must be 'function', got {tool.get('type')!r}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ToolRequestError("tools", f"{where}.function must be an object with a 'name'")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolRequestError(
            "tools", f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}"
        )
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ToolRequestError(
            "tools",
            f"{where}.function.parameters must be a JSON schema object, got {type(parameters).__name__}",
        )
    return function


def _checked_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise ToolRequestError("tools", f"tools must be a list of function tools, got {type(tools).__name__}")
    functions = [_function(index, tool) for index, tool in enumerate(tools)]
    names = [function["name"] for function in functions]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ToolRequestError("tools", f"tools names the function(s) {duplicates} more than once")
    return functions


def _chosen_name(tool_choice: dict[str, Any]) -> str:
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if tool_choice.get("type") != "function" or not isinstance(name, str):
        raise ToolRequestError(
            "tool_choice",
            "tool_choice must be 'none', 'auto', 'required' or "
            f'{{"type": "function", "function": {{"name": ...}}}}, got {json.dumps(tool_choice)[:200]}',
        )
    return name


def _needs_parameters(function: dict[str, Any], index: int, why: str) -> dict[str, Any]:
    if function.get("parameters") is None:
        raise ToolRequestError(
            "tools",
            f"tools[{index}].function ({function['name']}) has no 'parameters' schema, which {why} needs "
            'to constrain the call\'s arguments; add one (an object schema, {"type": "object"} for none)',
        )
    return function["parameters"]


def plan_tools(
    tools: Any, tool_choice: Any, auto_parser: Callable[[], ToolCallParser] | None, auto_hint: str
) -> ToolPlan:
    """Check `tools` / `tool_choice` and decide how to generate.

    `auto_parser` builds the configured tool-call parser (None: none configured); `auto_hint`
    says how to configure one, for the error when "auto" needs it.
    """
    functions = _checked_tools(tools) if tools is not None else []
    if isinstance(tool_choice, str):
        if tool_choice not in _MODES:
            raise ToolRequestError(
                "tool_choice",
                f"tool_choice must be one of {', '.join(_MODES)} or a named function, got {tool_choice!r}",
            )
        mode = tool_choice
    elif isinstance(tool_choice, dict):
        mode = "named"
    elif tool_choice is None:
        mode = "auto" if functions and auto_parser is not None else "none"
    else:
        raise ToolRequestError(
            "tool_choice", f"tool_choice must be a string or an object, got {tool_choice!r}"
        )
    template_tools = [{"type": "function", "function": copy.deepcopy(f)} for f in functions] or None
    if mode == "none":
        return ToolPlan("none", template_tools)
    if not functions:
        raise ToolRequestError(
            "tool_choice", f"tool_choice {json.dumps(tool_choice)} needs a non-empty 'tools' list"
        )
    if mode == "auto":
        if auto_parser is None:
            raise ToolRequestError("tool_choice", f"tool_choice 'auto' needs a tool-call parser: {auto_hint}")
        return ToolPlan("auto", template_tools, parser=auto_parser())
    if mode == "named":
        name = _chosen_name(tool_choice)
        known = [function["name"] for function in functions]
        if name not in known:
            raise ToolRequestError(
                "tool_choice",
                f"tool_choice names the function {name!r}, which is not in tools ({', '.join(known)})",
            )
        index = known.index(name)
        parameters = _needs_parameters(functions[index], index, "a named tool_choice")
        return ToolPlan(
            "named", template_tools, named_function_grammar(parameters), NamedFunctionParser(name)
        )
    for index, function in enumerate(functions):
        _needs_parameters(function, index, "tool_choice 'required'")
    return ToolPlan("required", template_tools, required_calls_grammar(functions), RequiredCallsParser())


def template_messages(messages: Any) -> Any:
    """`messages` with assistant tool-call arguments given as JSON strings turned into objects.

    OpenAI clients send a call's arguments as a JSON string; chat templates (Qwen, Llama 3,
    Hermes) expect a mapping, as transformers documents.
    """
    if not isinstance(messages, list):
        return messages
    converted = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(calls, list):
            message = {**message, "tool_calls": [_with_parsed_arguments(call) for call in calls]}
        converted.append(message)
    return converted


def _with_parsed_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return call
    return {**call, "function": {**function, "arguments": parsed}}


def parser_factory(parser_class: type | None, tokenizer: Any) -> Callable[[], ToolCallParser] | None:
    """What `plan_tools` builds the configured tool-call parser with (None: none configured)."""
    return (lambda: parser_class(tokenizer)) if parser_class is not None else None


def finish_answer(
    plan: ToolPlan, text: str, found: list[dict[str, Any]] | None
) -> tuple[str, list[dict[str, Any]] | None]:
    """(content, tool calls) of a finished sample's answer `text`.

    `found` are calls the reasoning parser already took out of the text (ERNIE-X1's); they are
    kept when the tool parser finds none.
    """
    if plan.parser is None:
        return text, found
    extraction = plan.parser.extract_tool_calls(text)
    if extraction.tools_called:
        return extraction.content or "", extraction.tool_calls
    return text, found
