"""What a request asks its output to match: FastDeploy's `GuidedDecodingParams`, vLLM's
`StructuredOutputsParams` (the same class under vLLM's newer name).

Exactly one constraint is set: `json` (a JSON schema as a dict, JSON text, or a pydantic model
class), `regex`, `choice` (a non-empty list of strings), `grammar` (Lark, or llama.cpp's GBNF),
`json_object=True` (any JSON object) or `structural_tag` (tagged segments in free text, as
vLLM's and OpenAI's `structural_tag`). This module checks only the shape of the request; whether
a schema, regex or grammar compiles is decided by the grammar backend when the engine takes the
request, and both kinds of failure raise `GuidedDecodingError` naming the field.
"""

from __future__ import annotations

import json as jsonlib
from dataclasses import dataclass, field
from typing import Any

from fastdeploy.errors import InvalidArgumentError

#: the constraint fields, in the order errors list them
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
#: most strings `choice` may list: llguidance's parser refuses an alternation of more than about
#: 2,000 items at the first token, and compiling 100,000 took 17 s of a server's CPU before failing
MAX_CHOICES = 1024


class GuidedDecodingError(InvalidArgumentError):
    """A guided-decoding request that cannot be served; `field` names the constraint at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _schema_dict(value: Any) -> dict[str, Any] | bool:
    """The JSON schema of `json=`: a dict, JSON text, or a pydantic model class or instance."""
    if isinstance(value, (dict, bool)):
        return value
    if isinstance(value, str):
        try:
            parsed = jsonlib.loads(value)
        except jsonlib.JSONDecodeError as exc:
            raise GuidedDecodingError("json", f"the JSON schema is not valid JSON: {exc}") from exc
        if not isinstance(parsed, (dict, bool)):
            raise GuidedDecodingError(
                "json", f"a JSON schema must be an object (or true/false), got {type(parsed).__name__}"
            )
        return parsed
    schema_of = getattr(value, "model_json_schema", None)
    if callable(schema_of):  # a pydantic model class (or instance), as FastDeploy and vLLM accept
        return schema_of()
    raise GuidedDecodingError(
        "json", f"json must be a JSON schema (dict or str) or a pydantic model, got {type(value).__name__}"
    )


def _structural_tag(value: Any) -> dict[str, Any]:
    """`{"structures": [{"begin", "schema", "end"}, ...], "triggers": [...]}` as a dict."""
    if isinstance(value, str):
        try:
            value = jsonlib.loads(value)
        except jsonlib.JSONDecodeError as exc:
            raise GuidedDecodingError("structural_tag", f"structural_tag is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise GuidedDecodingError("structural_tag", f"structural_tag must be an object, got {value!r}")
    structures, triggers = value.get("structures"), value.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise GuidedDecodingError("structural_tag", "structural_tag.structures must be a non-empty list")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise GuidedDecodingError(
            "structural_tag", "structural_tag.triggers must be a non-empty list of strings"
        )
    for index, item in enumerate(structures):
        if not isinstance(item, dict) or not isinstance(item.get("begin"), str) or not item["begin"]:
            raise GuidedDecodingError(
                "structural_tag", f"structural_tag.structures[{index}] needs a non-empty string 'begin'"
            )
        if not isinstance(item.get("end", ""), str):
            raise GuidedDecodingError(
                "structural_tag", f"structural_tag.structures[{index}].end must be a string"
            )
        if not any(item["begin"].startswith(trigger) for trigger in triggers):
            raise GuidedDecodingError(
                "structural_tag",
                f"structural_tag.structures[{index}].begin {item['begin']!r} starts with none of the triggers "
                f"{triggers}",
            )
        _schema_dict(item.get("schema", {}))
    return value


@dataclass
class GuidedDecodingParams:
    """One output constraint; see the module docstring. Shape errors raise `GuidedDecodingError`."""

    json: str | dict[str, Any] | Any | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    #: JSON without the optional whitespace between tokens (`{"a":1}`), vLLM's option; the server's
    #: `--guided-decoding-disable-any-whitespace` sets it for every request
    disable_any_whitespace: bool = False
    #: objects in `json` schemas that leave `additionalProperties` unset allow no extra keys
    disable_additional_properties: bool = False
    #: regex of the whitespace allowed between JSON tokens (None: the backend's default)
    whitespace_pattern: str | None = None
    #: the schema of `json` as a dict, filled by validation
    schema: dict[str, Any] | bool | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        chosen = [name for name in CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(chosen) != 1:
            found = ", ".join(chosen) if chosen else "none"
            raise GuidedDecodingError(
                chosen[0] if chosen else "json",
                f"guided decoding takes exactly one of {', '.join(CONSTRAINTS)}; got {found}",
            )
        if self.json is not None:
            self.schema = _schema_dict(self.json)
            if self.disable_additional_properties:
                self.schema = _closed_objects(self.schema)
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise GuidedDecodingError(name, f"{name} must be a non-empty string, got {value!r}")
        if self.choice is not None:
            self.choice = _choices(self.choice)
        if self.json_object not in (None, True, False):
            raise GuidedDecodingError("json_object", f"json_object must be a bool, got {self.json_object!r}")
        if self.structural_tag is not None:
            self.structural_tag = _structural_tag(self.structural_tag)
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise GuidedDecodingError(
                "whitespace_pattern", f"whitespace_pattern must be a string, got {self.whitespace_pattern!r}"
            )

    @property
    def kind(self) -> str:
        """Which constraint is set: one of `CONSTRAINTS`."""
        return next(name for name in CONSTRAINTS if getattr(self, name) not in (None, False))

    def cache_key(self) -> str:
        """A key equal for requests that compile to the same grammar."""
        value = self.schema if self.json is not None else getattr(self, self.kind)
        options = (self.disable_any_whitespace, self.whitespace_pattern)
        return jsonlib.dumps([self.kind, value, options], sort_keys=True, default=str)

    @classmethod
    def from_value(cls, value: Any) -> GuidedDecodingParams | None:
        """`SamplingParams.guided_decoding` as given: None, an instance, or a dict of its fields."""
        if value is None or isinstance(value, GuidedDecodingParams):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(CONSTRAINTS) - _OPTIONS)
            if unknown:
                raise GuidedDecodingError(
                    unknown[0], f"unknown guided decoding field(s) {unknown}; known: {list(CONSTRAINTS)}"
                )
            return cls(**value)
        raise GuidedDecodingError(
            "json", f"guided_decoding must be a GuidedDecodingParams or a dict, got {type(value).__name__}"
        )


_OPTIONS = {"disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"}


def _closed_objects(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that leaves it unset."""
    if isinstance(schema, list):
        return [_closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed_objects(value) for key, value in schema.items()}
    if (closed.get("type") == "object" or "properties" in closed) and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed


#: vLLM's newer name for the same parameters (`SamplingParams(structured_outputs=...)`)
StructuredOutputsParams = GuidedDecodingParams


def _choices(value: Any) -> list[str]:
    """`choice` as a list, checked (the message shows one bad item, never the whole list)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise GuidedDecodingError(
            "choice", f"choice must be a non-empty list of strings, got {type(value).__name__}"
        )
    if len(value) > MAX_CHOICES:
        raise GuidedDecodingError("choice", f"{len(value)} choices are too many: at most {MAX_CHOICES}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise GuidedDecodingError(
                "choice", f"choice must be a list of strings; item {index} is a {type(item).__name__}"
            )
    return list(value)
