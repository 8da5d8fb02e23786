"""`tools` and `tool_choice` in `/v1/chat/completions`: planning, the forced-call constraint,
and tool calls in messages and stream deltas.

The tool plan (see `fastdeploy.tool_calling.request`) decides the prompt's tools, the
constraint of a forced call and the parser that reads the answer. A response with calls has
`message.tool_calls` (content null when the model wrote none) and `finish_reason` "tool_calls";
streamed, the calls come as `delta.tool_calls` deltas.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from fastdeploy.engine.guided.decoder import GuidedDecoder
from fastdeploy.engine.request import CompletionOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.openai.errors import invalid_request
from fastdeploy.entrypoints.openai.protocol import ChatCompletionRequest
from fastdeploy.entrypoints.openai.structured_outputs import check_guided_decoding, requested_constraint
from fastdeploy.tool_calling.parser import ToolCallParser
from fastdeploy.tool_calling.request import ToolPlan, ToolRequestError, finish_answer, plan_tools
from fastdeploy.tool_calling.stream import ToolCallStream

_AUTO_HINT = (
    "start the server with --tool-call-parser NAME (hermes, qwen3, ernie-x1) and --enable-auto-tool-choice"
)


def plan_chat_tools(parser: Callable[[], ToolCallParser] | None, request: ChatCompletionRequest) -> ToolPlan:
    """The request's tool plan (`parser` builds the server's tool-call parser); a 400 naming
    `tools` or `tool_choice` if they are invalid."""
    if request.functions:
        raise invalid_request(
            "'functions' is OpenAI's deprecated form; send 'tools' with type 'function'", param="functions"
        )
    try:
        return plan_tools(request.tools, request.tool_choice, parser, _AUTO_HINT)
    except ToolRequestError as exc:
        raise invalid_request(str(exc), param=exc.param) from exc


async def constrain_for_tools(
    guided: GuidedDecoder, request: ChatCompletionRequest, params: SamplingParams, plan: ToolPlan
) -> SamplingParams:
    """`params` with the forced call's constraint, compiled now (400 naming `tools` if invalid)."""
    if plan.guided_decoding is None:
        return params
    constraint = requested_constraint(request)
    if constraint is not None:
        raise invalid_request(
            f"tool_choice {plan.mode!r} constrains the output to a function call, so {constraint[0]} cannot "
            "constrain it too; send one of them",
            param=constraint[0],
        )
    params = dataclasses.replace(params, guided_decoding=plan.guided_decoding, structured_outputs=None)
    await check_guided_decoding(guided, params, "tools")
    return params


def chat_message(plan: ToolPlan, sample: CompletionOutput) -> tuple[dict[str, Any], str | None]:
    """The assistant message of a finished sample, and its finish_reason."""
    content, calls = finish_answer(plan, sample.text, sample.tool_calls)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "reasoning_content": sample.reasoning_content,
    }
    if calls:
        message["tool_calls"] = calls
        message["content"] = content or None
    return message, _finish_reason(sample.finish_reason, bool(calls))


def _finish_reason(reason: str | None, called: bool) -> str | None:
    """ "tool_calls" for an answer with calls that ended on its own; "length" stays "length"."""
    return "tool_calls" if called and reason == "stop" else reason


class StreamedToolCalls:
    """The tool-call side of one streamed chat response: one `ToolCallStream` per sample."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self._streams: dict[int, ToolCallStream] = {}
        self._done: set[int] = set()

    def delta(
        self, sample: CompletionOutput, content: str, finish_reason: str | None
    ) -> tuple[str, list[dict[str, Any]], str | None]:
        """(content delta, tool-call deltas, finish_reason) for the sample's latest update.

        `content` and `finish_reason` are the plain-text delta; with a tool parser the content
        delta is what the parser shows instead.
        """
        if self.plan.parser is None:
            return content, self._found_calls(sample, finish_reason), self._reason(sample, finish_reason)
        stream = self._streams.get(sample.index)
        if stream is None:
            stream = self._streams[sample.index] = ToolCallStream(self.plan.parser)
        update = stream.update(sample.text, finished=sample.finish_reason is not None)
        calls = update.tool_calls or ([] if stream.called else self._found_calls(sample, finish_reason))
        return update.content, calls, self._reason(sample, _finish_reason(finish_reason, stream.called))

    def _found_calls(self, sample: CompletionOutput, finish_reason: str | None) -> list[dict[str, Any]]:
        """Calls the reasoning parser found (sent whole, once, when the sample finishes)."""
        if finish_reason is None or not sample.tool_calls or sample.index in self._done:
            return []
        self._done.add(sample.index)
        return [{"index": i, **call} for i, call in enumerate(sample.tool_calls)]

    def _reason(self, sample: CompletionOutput, finish_reason: str | None) -> str | None:
        return _finish_reason(finish_reason, sample.index in self._done) if finish_reason else finish_reason
