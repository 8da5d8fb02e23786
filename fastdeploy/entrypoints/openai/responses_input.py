"""`POST /v1/responses` requests, and their translation into the chat request the server runs.

A Responses request is served as a chat completion: its `instructions`, the stored conversation
of `previous_response_id` and its `input` items become chat messages; `tools`, `tool_choice`,
`text.format`, `max_output_tokens` and the sampling fields become the chat request's fields. So
the chat template, tools, structured outputs, media rules and limits are the chat endpoint's own.

Input items: messages (`role` user / assistant / system / developer, content a string or
`input_text`, `output_text`, `refusal` and `input_image` parts), `function_call` (the model's
call, as a previous response returned it), `function_call_output` (the result) and `reasoning`
(accepted and left out of the prompt, as chat templates drop earlier turns' reasoning). A
malformed item is a 400 naming it (`input[2].content[0]...`).
"""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from fastdeploy.entrypoints.openai.errors import invalid_request, unsupported
from fastdeploy.entrypoints.openai.protocol import ChatCompletionRequest, OpenAIBaseModel, _not_a_bool

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(OpenAIBaseModel):
    """`POST /v1/responses`: OpenAI's fields, and vLLM's / FastDeploy's sampling extensions."""

    model: str | None = None
    #: a string (one user message) or a list of input items
    input: Any = None
    instructions: str | None = None
    previous_response_id: str | None = None
    #: null means the default (true), as in OpenAI's API
    store: bool | None = True
    stream: bool | None = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    #: accepted: the tool-call parsers return every call the model writes
    parallel_tool_calls: bool | None = None
    #: {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    text: dict[str, Any] | None = None
    #: {"effort": ...}: passed to the chat template as `reasoning_effort`
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    truncation: str | None = None
    # --- understood, not supported (400 when used) -------------------------------------------
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    # --- extensions, as in chat requests -----------------------------------------------------
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    reasoning_max_tokens: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None

    _numbers = field_validator(
        "max_output_tokens",
        "temperature",
        "top_p",
        "top_logprobs",
        "max_tool_calls",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "seed",
        "reasoning_max_tokens",
        mode="before",
    )(_not_a_bool)


def reject_unsupported_fields(request: ResponsesRequest) -> None:
    """A 400 for each field this server understands but cannot honour."""
    if request.background:
        raise unsupported("background", "background responses")
    if request.conversation is not None:
        raise unsupported("conversation", "stored conversations (use previous_response_id)")
    if request.prompt is not None:
        raise unsupported("prompt", "stored prompt templates")
    if request.truncation not in (None, "disabled"):
        raise unsupported("truncation", "dropping input that does not fit the context")
    if request.top_logprobs:
        raise unsupported("top_logprobs", "log probabilities in responses")
    if request.max_tool_calls is not None:
        raise unsupported("max_tool_calls", "a bound on tool calls")


def input_messages(value: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages of a request's `input`, and for each the input field its content parts
    came from (`input[2].content`), which errors about a part name; a 400 naming the malformed
    item otherwise."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}], ["input"]
    if not isinstance(value, list):
        shown = "nothing" if value is None else type(value).__name__
        raise invalid_request(f"input must be a string or a list of input items, got {shown}", param="input")
    messages: list[dict[str, Any]] = []
    sources: list[str] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object (an input item), got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
            sources.append(f"{where}.content")
        elif kind == "function_call":
            if _add_call(messages, item, where):
                sources.append(where)
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": _string(item, "call_id", where), **_output(item, where)}
            )
            sources.append(f"{where}.output")
        elif kind != "reasoning":
            raise _bad(
                f"{where}.type {kind!r} is not supported; use message, function_call, "
                "function_call_output or reasoning"
            )
    if not messages:
        raise invalid_request("input must contain at least one message", param="input")
    return messages, sources


def _bad(message: str) -> Exception:
    return invalid_request(message, param="input")


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(f"{where}.{key} must be a non-empty string, got {value!r}"[:300])
    return value


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise _bad(f"{where}.role must be one of {', '.join(_ROLES)}, got {role!r}"[:300])
    content = item.get("content")
    if isinstance(content, str):
        return {"role": _ROLES[role], "content": content}
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content parts")
    return {
        "role": _ROLES[role],
        "content": [_part(part, f"{where}.content[{i}]") for i, part in enumerate(content)],
    }


def _part(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise _bad(f"{where} must be an object with a 'type', got {type(part).__name__}")
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        return {"type": "text", "text": _text(part, "text", where)}
    if kind == "refusal":
        return {"type": "text", "text": _text(part, "refusal", where)}
    if kind == "input_image":
        url = part.get("image_url")
        if part.get("file_id") is not None and url is None:
            raise _bad(
                f"{where}: images by file_id need a files API this server does not have; send image_url"
            )
        if not isinstance(url, str) or not url:
            raise _bad(f"{where}: an input_image part needs 'image_url' (an http(s) or data: URL)")
        return {"type": "image_url", "image_url": {"url": url}}
    raise _bad(
        f"{where}.type {kind!r} is not supported; use input_text, output_text, refusal or input_image"[:300]
    )


def _text(part: dict[str, Any], key: str, where: str) -> str:
    value = part.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def _add_call(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> bool:
    """A `function_call` item joins the assistant message before it (a turn that called tools);
    True when it had to open a message of its own."""
    arguments = item.get("arguments", "")
    if not isinstance(arguments, str):
        raise _bad(f"{where}.arguments must be a string (the call's JSON arguments)")
    call = {
        "id": _string(item, "call_id", where),
        "type": "function",
        "function": {"name": _string(item, "name", where), "arguments": arguments},
    }
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
        return False
    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    return True


def _output(item: dict[str, Any], where: str) -> dict[str, Any]:
    output = item.get("output")
    if isinstance(output, str):
        return {"content": output}
    if isinstance(output, list):
        return {"content": [_part(part, f"{where}.output[{i}]") for i, part in enumerate(output)]}
    raise _bad(f"{where}.output must be a string or a list of content parts")


def chat_tools(tools: list[Any] | None) -> list[Any] | None:
    """Responses' function tools (`{"type": "function", "name", "parameters", ...}`) in the chat
    form (`{"type": "function", "function": {...}}`); other tool types are a 400 naming them."""
    if tools is None:
        return None
    converted = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise invalid_request(
                f"tools[{index}]: only tools of type 'function' are supported, got {kind!r}"[:300],
                param="tools",
            )
        function = {key: value for key, value in tool.items() if key != "type"}
        converted.append({"type": "function", "function": function})
    return converted


def chat_tool_choice(choice: Any) -> Any:
    """`{"type": "function", "name": N}` in the chat form; the modes stay as they are."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as the chat request's `response_format` (json_schema's fields nest under
    `json_schema` there)."""
    if text is None:
        return None
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid_request("text.format must be an object with a 'type'", param="text")
    if fmt.get("type") == "json_schema":
        if "schema" not in fmt:
            raise invalid_request(
                "text.format of type json_schema needs 'name' and 'schema'; 'schema' is missing", param="text"
            )
        spec = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return dict(fmt)


def chat_request(request: ResponsesRequest, conversation: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request that serves `request`: `instructions` as the system message, then the
    `conversation` (a stored one continued, then this request's input)."""
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    template_kwargs = dict(request.chat_template_kwargs or {})
    effort = (request.reasoning or {}).get("effort")
    if effort is not None:
        template_kwargs.setdefault("reasoning_effort", effort)
    fields = {
        name: getattr(request, name)
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "seed",
            "stop",
            "reasoning_max_tokens",
            "mm_processor_kwargs",
            "user",
            "parallel_tool_calls",
        )
        if getattr(request, name) is not None
    }
    return ChatCompletionRequest(
        model=request.model,
        messages=[*system, *conversation],
        max_completion_tokens=request.max_output_tokens,
        ignore_eos=request.ignore_eos,
        tools=chat_tools(request.tools),
        tool_choice=chat_tool_choice(request.tool_choice),
        response_format=response_format(request.text),
        chat_template_kwargs=template_kwargs or None,
        **fields,
    )
