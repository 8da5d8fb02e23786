"""Renders chat messages into a prompt with the model's Jinja chat template, as transformers does.

Chat templates are written against transformers' rendering environment, so we reproduce it: a
sandboxed, immutable Jinja environment (templates come from model files, i.e. untrusted) with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter that does not
HTML-escape, and the globals `raise_exception` and `strftime_now`. Special tokens
(`bos_token`, ...) and any extra keyword arguments (`chat_template_kwargs` such as
`enable_thinking`) are template variables. Compiled templates are cached.

OpenAI-style messages may carry their content as a list of parts (`{"type": "text", ...}`).
Templates that loop over `message['content']` receive the parts; templates that treat content
as a string receive the text parts joined by newlines (vLLM's "string" content format). A
template that tests for `image` (`video`) parts but never names `image_url` (`video_url`), as
transformers-style templates do (PaddleOCR-VL's), receives OpenAI's URL parts as `image`
(`video`) parts, so they get their placeholders.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from fastdeploy.errors import InvalidArgumentError

_NO_TEMPLATE = (
    "the model has no chat template, so chat messages cannot be turned into a prompt; pass "
    "chat_template= (a Jinja template string or the path of a .jinja file), or send a plain "
    "prompt instead of messages"
)


def render_chat_template(
    template: str | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """The prompt text for `messages`.

    `special_tokens` (e.g. {"bos_token": "<s>"}) and `kwargs` become template variables;
    `kwargs` win on a name clash, as in transformers. `tools` and `documents` default to None.
    Raises `InvalidArgumentError` when there is no template, the template is not valid Jinja or
    fails while rendering, or a message is malformed (the message names its index).
    """
    if not template:
        raise InvalidArgumentError(_NO_TEMPLATE)
    if not isinstance(template, str):
        raise InvalidArgumentError(f"chat_template must be a str, got {type(template).__name__}")
    if "messages" in kwargs:
        raise InvalidArgumentError(
            "'messages' is reserved for the conversation and cannot be a template kwarg"
        )
    compiled, loops_over_content, renamed_parts = _compile(template)
    checked = _plain_data(validate_messages(messages))
    if not loops_over_content:
        checked = [_flatten_text_parts(index, message) for index, message in enumerate(checked)]
    elif renamed_parts:
        checked = [_renamed_parts(message, renamed_parts) for message in checked]
    variables: dict[str, Any] = {
        "tools": None,
        "documents": None,
        **(special_tokens or {}),
        **_plain_data(kwargs),
    }
    try:
        return compiled.render(messages=checked, add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as exc:
        raise InvalidArgumentError(f"chat template error: {exc}") from exc
    except Exception as exc:  # a template is code from the model files; any failure is the template's
        raise InvalidArgumentError(
            f"chat template failed to render the messages: {type(exc).__name__}: {exc}"
        ) from exc


def load_chat_template(value: str | os.PathLike[str]) -> str:
    """A `chat_template=` override: a literal Jinja template, or a path to one.

    A string containing "{" or a newline is taken as the template itself; anything else must be
    a readable file (`.jinja` text, or a `.json` file with a "chat_template" string as
    transformers' processors save it). Either way it must be valid Jinja, checked here so that a
    broken override fails where it is given, not in every chat.
    """
    text = _template_text(value)
    _compile(text)
    return text


def _template_text(value: str | os.PathLike[str]) -> str:
    if isinstance(value, str) and ("{" in value or "\n" in value):
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise InvalidArgumentError(f"chat_template must be a str or a path, got {type(value).__name__}")
    path = os.path.expanduser(os.fspath(value))
    if not os.path.isfile(path):
        raise InvalidArgumentError(
            f"chat_template={os.fspath(value)!r} is neither a Jinja template (no '{{' in it) nor an existing file"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"chat template file {path} cannot be read: {exc}") from exc
    if path.endswith(".json"):
        try:
            text = json.loads(text)["chat_template"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InvalidArgumentError(f"{path} is not a JSON object with a 'chat_template' string") from exc
        if not isinstance(text, str):
            raise InvalidArgumentError(f"{path}: 'chat_template' must be a string")
    return text


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Shallow copies of `messages` after checking their shape; errors name the bad index."""
    if not isinstance(messages, (list, tuple)):
        raise InvalidArgumentError(
            f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}"
        )
    if not messages:
        raise InvalidArgumentError("messages is empty; a chat needs at least one message")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidArgumentError(
                f"messages[{index}] must be a dict with 'role' and 'content', got {type(message).__name__}"
            )
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidArgumentError(f"messages[{index}] needs a non-empty string 'role', got {role!r}")
        content = message.get("content")
        if content is None:
            if not (role == "assistant" and message.get("tool_calls")):
                raise InvalidArgumentError(
                    f"messages[{index}] (role {role!r}) has no 'content'; only an assistant message "
                    "with tool_calls may omit it"
                )
        elif isinstance(content, (list, tuple)):
            _check_parts(index, content)
        elif not isinstance(content, str):
            raise InvalidArgumentError(
                f"messages[{index}]['content'] must be a string or a list of content parts, "
                f"got {type(content).__name__}"
            )
        checked.append(dict(message))
    return checked


def _check_parts(index: int, parts: list[Any] | tuple[Any, ...]) -> None:
    for part_index, part in enumerate(parts):
        where = f"messages[{index}]['content'][{part_index}]"
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise InvalidArgumentError(
                f"{where} must be a dict with a string 'type', e.g. {{'type': 'text', 'text': ...}}"
            )
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise InvalidArgumentError(f"{where} is a text part without a string 'text'")


def _plain_data(value: Any) -> Any:
    """A copy of `value` made only of JSON-like types, so a template reaches no object methods.

    The sandbox hides underscore attributes but not public methods, and callers may put rich
    objects (images, arrays, pydantic models) into messages; an untrusted template could call
    e.g. an image's `save`. Subclasses of str/int/float are reduced to the base type; other
    objects become a placeholder naming their type, e.g. "<ndarray>" (templates only test
    whether such keys are present). This mirrors what transformers does before rendering.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    for base in (str, int, float):
        if isinstance(value, base):
            return base.__str__(value) if base is str else base(value)
    if isinstance(value, Mapping):
        return {_plain_data(key): _plain_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain_data(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain_data(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain_data(value.model_dump())
    if callable(getattr(value, "item", None)) and getattr(value, "shape", None) == ():
        return _plain_data(value.item())  # numpy scalars
    return f"<{type(value).__name__}>"


def _flatten_text_parts(index: int, message: dict[str, Any]) -> dict[str, Any]:
    """For string-content templates: list content becomes its text parts joined by newlines."""
    content = message.get("content")
    if not isinstance(content, (list, tuple)):
        return message
    texts = []
    for part in content:
        if part["type"] != "text":
            raise InvalidArgumentError(
                f"messages[{index}] has a {part['type']!r} content part, but this chat template only "
                "takes text content"
            )
        texts.append(part["text"])
    return {**message, "content": "\n".join(texts)}


def _renamed_parts(message: dict[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """The message with its content parts' types renamed (`image_url` -> `image`, ...)."""
    content = message.get("content")
    if not isinstance(content, (list, tuple)):
        return message
    parts = [{**part, "type": renames.get(part["type"], part["type"])} for part in content]
    return {**message, "content": parts}


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore names, so templates cannot reach Python internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - mirrors jinja2's signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set namespace attribute {name!r}")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes "<", ">", "&" and "'", which would change tool schemas in prompts.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:  # noqa: A002 - the name templates call it with
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _TemplateNamespace
    return env


#: OpenAI's URL part types and the in-memory part types of transformers-style templates
_URL_PARTS = {"image_url": "image", "video_url": "video"}


@lru_cache(maxsize=32)
def _compile(template: str) -> tuple[jinja2.Template, bool, dict[str, str]]:
    """The compiled template, whether it loops over message content, and the URL part types it
    takes under their in-memory names (`_URL_PARTS` entries whose URL name the template never
    writes but whose in-memory name it does), cached per template text."""
    env = _environment()
    try:
        tree = env.parse(template)
        compiled = env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidArgumentError(
            f"chat template is not valid Jinja (line {exc.lineno}): {exc.message}"
        ) from exc
    named = {node.value for node in tree.find_all(jinja2.nodes.Const) if isinstance(node.value, str)}
    renames = {url: plain for url, plain in _URL_PARTS.items() if url not in named and plain in named}
    return compiled, _loops_over_content(tree), renames


def _is_content(node: jinja2.nodes.Node) -> bool:
    """`x['content']` or `x.content`."""
    if isinstance(node, jinja2.nodes.Getitem):
        return isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == "content"
    return isinstance(node, jinja2.nodes.Getattr) and node.attr == "content"


def _loops_over_content(tree: jinja2.nodes.Template) -> bool:
    """Whether the template iterates over a message's content, directly or via a `set` variable."""
    content_names = {
        node.target.name
        for node in tree.find_all(jinja2.nodes.Assign)
        if isinstance(node.target, jinja2.nodes.Name) and _is_content(node.node)
    }
    for loop in tree.find_all(jinja2.nodes.For):
        iterable = loop.iter
        if isinstance(iterable, jinja2.nodes.Filter) and iterable.node is not None:
            iterable = iterable.node
        if _is_content(iterable) or (
            isinstance(iterable, jinja2.nodes.Name) and iterable.name in content_names
        ):
            return True
    return False
