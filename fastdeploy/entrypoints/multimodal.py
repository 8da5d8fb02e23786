"""Where images and videos come from in a request: chat content parts and `multimodal_data`.

Shared by `LLM.chat` / `LLM.generate` and the OpenAI server, so both accept the same forms and
fail with the same messages. Content parts (OpenAI's and FastDeploy's): `{"type": "image_url",
"image_url": {"url": ...}}` (or the url as a plain string), `{"type": "video_url", "video_url":
{"url": ...}}`, and `{"type": "image", "image": <PIL image, bytes, array, path>}` /
`{"type": "video", "video": ...}` for data already in memory; `text` parts are left to the chat
template. Media are returned in conversation order, which is the order of their placeholders.
"""

from __future__ import annotations

from typing import Any

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.multimodal.inputs import MultiModalPrompt

_URL_PARTS = {"image_url": "image", "video_url": "video"}
_DATA_PARTS = {"image": "image", "video": "video"}


def _url_of(part: dict[str, Any], kind: str, what: str) -> Any:
    value = part.get(kind)
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{what}: a {kind} part needs {{'{kind}': {{'url': '...'}}}}")
    return value


def extract_media(conversation: Any) -> tuple[list[Any], list[Any]]:
    """(images, videos) of a chat conversation's content parts, in order."""
    images: list[Any] = []
    videos: list[Any] = []
    if not isinstance(conversation, list):
        return images, videos
    for m, message in enumerate(conversation):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            what = f"message {m} content part {p}"
            if not isinstance(part, dict):
                raise InvalidArgumentError(f"{what} must be a dict with a 'type', got {type(part).__name__}")
            kind = part.get("type")
            if kind in _URL_PARTS:
                target = images if _URL_PARTS[kind] == "image" else videos
                target.append(_url_of(part, kind, what))
            elif kind in _DATA_PARTS:
                if kind not in part:
                    raise InvalidArgumentError(f"{what}: an {kind!r} part needs its data under {kind!r}")
                (images if kind == "image" else videos).append(part[kind])
            elif kind != "text":
                raise InvalidArgumentError(
                    f"{what} has unknown type {kind!r}; use text, image_url, video_url, image or video"
                )
    return images, videos


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def multimodal_data(value: Any, where: str) -> tuple[list[Any], list[Any]]:
    """(images, videos) of a `multimodal_data` dict ({"image": [...], "video": [...]})."""
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{where}: multimodal_data must be a dict with 'image' and/or 'video'")
    unknown = sorted(set(value) - {"image", "video"})
    if unknown:
        raise InvalidArgumentError(
            f"{where}: multimodal_data has unknown key(s) {unknown}; use 'image', 'video'"
        )
    return _as_list(value.get("image")), _as_list(value.get("video"))


def process_media(
    processor: Any,
    architecture: str,
    token_ids: list[int],
    images: list[Any],
    videos: list[Any],
    mm_processor_kwargs: dict[str, Any] | None = None,
    policy: Any = None,
) -> MultiModalPrompt:
    """The processor's `MultiModalPrompt` for a prompt with media; refuses text-only models."""
    if processor is None:
        raise InvalidArgumentError(f"{architecture} takes text only; this request has images or videos")
    return processor.process(token_ids, images, videos, mm_processor_kwargs, policy)
