"""Where images and videos come from in a request: chat content parts and `multimodal_data`.

Shared by `LLM.chat` / `LLM.generate` and the OpenAI server (through `input.processor`), so both
accept the same forms and fail with the same messages. Content parts (OpenAI's and FastDeploy's):
`{"type": "image_url", "image_url": {"url": ...}}` (or the url as a plain string), `{"type":
"video_url", "video_url": {"url": ...}}`, and `{"type": "image", "image": <PIL image, bytes,
array, path>}` /
`{"type": "video", "video": ...}` for data already in memory; `text` parts are left to the chat
template. Media are returned in conversation order, which is the order of their placeholders.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.media_fetch import MAX_FETCHES_IN_FLIGHT
from fastdeploy.input.multimodal.errors import MediaError
from fastdeploy.input.multimodal.media import MediaPolicy, fetch_media, is_fetched_url
from fastdeploy.input.multimodal.options import enforce_limits

_URL_PARTS = {"image_url": "image", "video_url": "video"}
_DATA_PARTS = {"image": "image", "video": "video"}


def _url_of(part: dict[str, Any], kind: str, what: str) -> Any:
    value = part.get(kind)
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{what}: a {kind} part needs {{'{kind}': {{'url': '...'}}}}")
    return value


@dataclass
class Media:
    """The images and videos of one request, in prompt order, with the names errors use."""

    images: list[Any] = field(default_factory=list)
    videos: list[Any] = field(default_factory=list)
    #: {"image": ["message 0 content part 1", ...], "video": [...]}
    labels: dict[str, list[str]] = field(default_factory=lambda: {"image": [], "video": []})

    def __bool__(self) -> bool:
        return bool(self.images or self.videos)

    def add(self, modality: str, value: Any, label: str) -> None:
        (self.images if modality == "image" else self.videos).append(value)
        self.labels[modality].append(label)


def extract_media(conversation: Any) -> Media:
    """The images and videos of a chat conversation's content parts, in order."""
    media = Media()
    if not isinstance(conversation, list):
        return media
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
                media.add(_URL_PARTS[kind], _url_of(part, kind, what), what)
            elif kind in _DATA_PARTS:
                if kind not in part:
                    raise InvalidArgumentError(f"{what}: an {kind!r} part needs its data under {kind!r}")
                media.add(kind, part[kind], what)
            elif kind != "text":
                raise InvalidArgumentError(
                    f"{what} has unknown type {kind!r}; use text, image_url, video_url, image or video"
                )
    return media


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def multimodal_data(value: Any, where: str) -> Media:
    """The images and videos of a `multimodal_data` dict ({"image": [...], "video": [...]})."""
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{where}: multimodal_data must be a dict with 'image' and/or 'video'")
    unknown = sorted(set(value) - {"image", "video"})
    if unknown:
        raise InvalidArgumentError(
            f"{where}: multimodal_data has unknown key(s) {unknown}; use 'image', 'video'"
        )
    media = Media()
    for modality in ("image", "video"):
        for index, item in enumerate(_as_list(value.get(modality))):
            media.add(modality, item, f"{where}: multimodal_data {modality} {index}")
    return media


def _urls(value: Any) -> list[str]:
    """The http(s) URLs in one image or video value (a URL, a video dict, a list of frames)."""
    if is_fetched_url(value):
        return [value]
    if isinstance(value, dict):
        return _urls(value.get("video"))
    if isinstance(value, (list, tuple)):
        return [url for item in value for url in _urls(item)]
    return []


def _replaced(value: Any, fetched: dict[str, Any]) -> Any:
    """`value` with each URL `_urls` found swapped for its fetched bytes."""
    if isinstance(value, str):
        return fetched.get(value, value)
    if isinstance(value, dict) and "video" in value:
        return {**value, "video": _replaced(value["video"], fetched)}
    if isinstance(value, (list, tuple)):
        return [_replaced(item, fetched) for item in value]
    return value


def fetch_limit(limits: dict[str, int]) -> int:
    """Most URLs one request may make the server fetch: its `limit_mm_per_prompt` items (or, with
    no limits set, as many as may be in flight at once in the process)."""
    return sum(limits.values()) if limits else MAX_FETCHES_IN_FLIGHT


async def prefetch_media(media: Media, policy: MediaPolicy, limits: dict[str, int]) -> Media:
    """`media` with its http(s) URLs fetched, awaited on the caller's event loop (the fetch runs on
    the fetch thread), so the preprocessing threads that decode it never wait on a network.

    Nothing is fetched when fetching is off (the processor says so), or when the request has more
    items than `limit_mm_per_prompt` (`limits`) allows. A failure raises the uniform MediaError
    naming its part; the request's other fetches are cancelled."""
    if not media or not policy.allow_fetch:
        return media
    enforce_limits(limits, {"image": len(media.images), "video": len(media.videos)})
    jobs: dict[str, str] = {}  # url -> the part it is fetched for
    for modality, values in (("image", media.images), ("video", media.videos)):
        for value, label in zip(values, media.labels[modality], strict=True):
            for url in _urls(value):
                jobs.setdefault(url, label)
    if not jobs:
        return media
    limit = fetch_limit(limits)
    if len(jobs) > limit:
        raise MediaError(
            f"this request names {len(jobs)} media URLs; at most {limit} are fetched per request"
        )
    tasks = {url: asyncio.ensure_future(fetch_media(url, label, policy)) for url, label in jobs.items()}
    try:
        await asyncio.gather(*tasks.values())
    finally:  # one failed (or the request went away): the others stop, their outcomes collected
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    fetched = {url: task.result() for url, task in tasks.items()}
    return Media(
        [_replaced(value, fetched) for value in media.images],
        [_replaced(value, fetched) for value in media.videos],
        media.labels,
    )
