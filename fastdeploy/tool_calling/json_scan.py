"""Reading a function call's JSON object while it is still being generated.

A call is an object like `{"name": "get_weather", "arguments": {"city": "Paris"}}` (Hermes,
Qwen, ERNIE) or `{"name": ..., "parameters": {...}}` (the forced-call array). While the model
writes it, a streaming client wants the name as soon as it is complete and the arguments as raw
JSON text fragments. `scan_call` returns the name once its string is closed and the arguments'
text so far, which only ever grows by appending until the arguments' value closes: so the
fragments a client concatenates are exactly the final arguments text.

Why not a partial-JSON library: those return parsed (and re-serialised) values of a prefix,
which change shape as text arrives; what a stream needs here is the byte offsets of one value in
the raw text, which a string-aware bracket scan gives directly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"
#: keys under which formats put a call's arguments
ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass
class CallDraft:
    """A call as far as it has been generated."""

    name: str | None = None
    #: raw JSON text of the arguments so far (complete once `arguments_complete`)
    arguments: str = ""
    arguments_complete: bool = False
    #: the arguments arrived as a JSON string holding JSON (some models do that): not streamable
    arguments_quoted: bool = False


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def container_end(text: str, pos: int) -> int | None:
    """Index past the object or array opening at `text[pos]`, or None if it is not closed yet."""
    depth, in_string, escaped = 0, False, False
    for index in range(pos, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return index + 1
    return None


def _value_end(text: str, pos: int) -> int | None:
    """Index past the JSON value starting at `pos` (None: incomplete or malformed)."""
    if pos >= len(text):
        return None
    if text[pos] in "{[":
        return container_end(text, pos)
    try:
        _, end = _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        return None
    # a number or literal at the very end may still grow ("12" -> "123")
    return end if end < len(text) or text[pos] == '"' else None


def scan_call(text: str, pos: int) -> tuple[CallDraft, int | None]:
    """Read the call object opening at `text[pos]` ('{'): (the draft, index past its '}' or None)."""
    draft = CallDraft()
    pos += 1
    while True:
        pos = _skip_space(text, pos)
        if pos >= len(text):
            return draft, None
        if text[pos] == "}":
            return draft, pos + 1
        if text[pos] == ",":
            pos += 1
            continue
        try:
            key, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            return draft, None
        pos = _skip_space(text, pos)
        if pos >= len(text) or text[pos] != ":":
            return draft, None
        start = _skip_space(text, pos + 1)
        end = _value_end(text, start)
        if key in ARGUMENT_KEYS:
            draft.arguments_quoted = start < len(text) and text[start] == '"'
            if end is not None:
                raw = text[start:end]
                draft.arguments = json.loads(raw) if draft.arguments_quoted else raw
                draft.arguments_complete = True
            elif not draft.arguments_quoted:
                draft.arguments = text[start:]
        elif key == "name" and end is not None:
            value = json.loads(text[start:end])
            draft.name = value if isinstance(value, str) else None
        if end is None:
            return draft, None
        pos = end
