"""Structured-output request fields -> `GuidedDecodingParams`, and their 400s.

A request constrains its output with one of: FastDeploy's and vLLM's `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar`, `structural_tag`; OpenAI's `response_format`
(`json_object`, `json_schema`, and vLLM's `structural_tag`); or vLLM's newer
`structured_outputs` object. Setting two of them is a 400 naming both. Errors name the request
field the user wrote, whichever `GuidedDecodingParams` field they map to.

The grammar is compiled (on a worker thread: a large schema may take a while) before the
request reaches the engine, so an invalid schema, regex or grammar is answered with a 400 even
on a streaming request; the engine then finds the compiled grammar in its cache.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastdeploy.engine.guided.decoder import GuidedDecoder
from fastdeploy.engine.guided.params import GuidedDecodingError, GuidedDecodingParams
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.openai.errors import OpenAIError, invalid_request
from fastdeploy.entrypoints.openai.protocol import SamplingRequest

#: request field -> GuidedDecodingParams field
_GUIDED_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    "structural_tag": "structural_tag",
}


def _from_response_format(value: dict[str, Any]) -> dict[str, Any] | None:
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise invalid_request(
                "response_format of type json_schema needs json_schema: {name, schema, strict}; "
                "json_schema.schema is missing",
                param="response_format",
            )
        return {"json": spec["schema"]}
    if kind == "structural_tag":
        return {"structural_tag": {key: value.get(key) for key in ("structures", "triggers")}}
    raise invalid_request(
        f"response_format.type must be one of text, json_object, json_schema, structural_tag; got {kind!r}",
        param="response_format",
    )


def requested_constraint(request: SamplingRequest) -> tuple[str, dict[str, Any]] | None:
    """(the request field that sets a constraint, GuidedDecodingParams keyword arguments), or None."""
    found: list[tuple[str, dict[str, Any]]] = []
    for name, target in _GUIDED_FIELDS.items():
        value = getattr(request, name)
        if value is not None:
            found.append((name, {target: value}))
    if request.response_format is not None:
        converted = _from_response_format(request.response_format)
        if converted is not None:
            found.append(("response_format", converted))
    if request.structured_outputs is not None:
        if not isinstance(request.structured_outputs, dict):
            raise invalid_request("structured_outputs must be an object", param="structured_outputs")
        found.append(("structured_outputs", dict(request.structured_outputs)))
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise invalid_request(f"{names} each constrain the output; send only one of them", param=found[1][0])
    if not found:
        return None
    name, kwargs = found[0]
    if request.guided_whitespace_pattern is not None:
        kwargs.setdefault("whitespace_pattern", request.guided_whitespace_pattern)
    return name, kwargs


def guided_decoding(request: SamplingRequest) -> GuidedDecodingParams | None:
    """The request's constraint; a 400 naming the field if its shape is wrong."""
    constraint = requested_constraint(request)
    if constraint is None:
        return None
    name, kwargs = constraint
    try:
        return GuidedDecodingParams.from_value(kwargs)
    except GuidedDecodingError as exc:
        raise guided_error(name, exc) from exc


def guided_error(param: str, exc: GuidedDecodingError) -> OpenAIError:
    return invalid_request(f"{param}: {exc}", param=param, code="invalid_guided_decoding")


async def check_guided_decoding(guided: GuidedDecoder, params: SamplingParams, param: str) -> None:
    """Compile the request's grammar now (cached by the engine's guided decoder); a 400 naming
    `param` if invalid."""
    if params.guided_decoding is None:
        return
    try:
        await asyncio.to_thread(guided.compile, params.guided_decoding)
    except GuidedDecodingError as exc:
        raise guided_error(param, exc) from exc


async def check_request_guided_decoding(
    guided: GuidedDecoder, request: SamplingRequest, params: SamplingParams
) -> None:
    """`check_guided_decoding` for a constraint the request set itself."""
    constraint = requested_constraint(request)
    if constraint is not None:
        await check_guided_decoding(guided, params, constraint[0])
