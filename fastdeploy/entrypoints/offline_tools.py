"""`LLM.chat(messages, tools=..., tool_choice=...)`: tools in the prompt, forced calls constrained,
and `CompletionOutput.tool_calls` filled, with the same rules as the server's chat endpoint.

Invalid `tools` / `tool_choice` fail every conversation of the call with `error_code` 400 (they
share the tools); a forced call on a conversation whose `SamplingParams` already constrain the
output fails that conversation alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from fastdeploy.engine.request import OK, RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.tool_calling.parser import ToolCallParser
from fastdeploy.tool_calling.request import ToolPlan, ToolRequestError, finish_answer, plan_tools

_AUTO_HINT = "build the LLM with tool_call_parser=NAME (hermes, qwen3, ernie-x1)"


def plan_offline(
    parser: Callable[[], ToolCallParser] | None, tools: Any, tool_choice: Any
) -> tuple[ToolPlan, str | None]:
    """(the plan, None) or (a plan without tools, the error every conversation fails with);
    `parser` builds the configured tool-call parser (`tool_calling.request.parser_factory`)."""
    try:
        return plan_tools(tools, tool_choice, parser, _AUTO_HINT), None
    except ToolRequestError as exc:
        return ToolPlan("none", None), f"{exc.param}: {exc}"


def constrain_offline(params: SamplingParams, plan: ToolPlan) -> tuple[SamplingParams, str | None]:
    """`params` with a forced call's constraint, or an error if they constrain the output already."""
    if plan.guided_decoding is None:
        return params, None
    if params.guided_decoding is not None:
        return params, (
            f"tool_choice {plan.mode!r} constrains the output to a function call, so "
            "SamplingParams.guided_decoding cannot constrain it too; set one of them"
        )
    return dataclasses.replace(params, guided_decoding=plan.guided_decoding, structured_outputs=None), None


def fill_tool_calls(outputs: list[RequestOutput], plan: ToolPlan) -> None:
    """Move each finished sample's calls from `text` to `tool_calls`."""
    if plan.parser is None:
        return
    for output in outputs:
        if output.error_code != OK:
            continue
        for sample in output.outputs:
            sample.text, sample.tool_calls = finish_answer(plan, sample.text, sample.tool_calls)
