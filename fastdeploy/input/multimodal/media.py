"""Turning what users pass as an image or a video into pixels, with a clear error per part.

Accepted images: a PIL image, encoded bytes, a file path, a numpy array ([H, W], [H, W, 3|4]
uint8, or float in [0, 1]), and in chat content parts `data:` URLs, `file://` or plain local
paths (when `MediaPolicy.allow_local` permits) and `http(s)://` URLs (when fetching is on, under
the rules of `fastdeploy.input.media_fetch`: no private destinations by default, checked
redirects, a timeout and a size cap). Accepted videos: encoded bytes or a file path (decoded by PyAV), a
list of frames (any image form above), a numpy array [T, H, W, 3], or a dict
`{"video": <one of those>, "fps": .., "min_frames": .., "max_frames": ..}` as in FastDeploy's
documentation.

Decompression bombs are refused: an image whose pixel count exceeds
`MediaPolicy.max_image_pixels` fails before it is decoded.

Whatever goes wrong with a fetched URL (refused, unreachable, timed out, too large, not an image)
answers the same `"<part>: could not fetch the media URL"`, so errors cannot map the server's
network; the reason goes to the server log. `data:` URLs, bytes and files keep specific messages.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import os
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.input.media_fetch import FetchFailed, FetchPolicy, fetch, fetch_async
from fastdeploy.input.multimodal.errors import MediaError, require_pillow
from fastdeploy.input.multimodal.image_processor import to_rgb
from fastdeploy.input.multimodal.video_processor import DecodedVideo, decode_video
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: the whole client-facing reason of any failed or refused URL fetch, after the part's name
FETCH_FAILED = "could not fetch the media URL"


@dataclass(frozen=True)
class MediaPolicy:
    """Where media may come from and how large it may be."""

    #: local files: True (anywhere: offline use), False, or a directory they must lie under
    allow_local: bool | str = True
    #: fetch http(s) URLs
    allow_fetch: bool = True
    #: which URLs may be fetched: hosts, private networks, redirects, timeout, size cap
    fetch: FetchPolicy = FetchPolicy()
    #: largest inline payload (bytes, data: URL, file), in bytes
    max_bytes: int = 64 * 1024 * 1024
    #: largest image, in pixels (Pillow's decompression-bomb limit is 89.5 M)
    max_image_pixels: int = 89_478_485


def _decode_data_url(url: str, what: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep:
        raise MediaError(f"{what}: a data: URL needs a ',' before its payload")
    if not header.endswith(";base64"):
        return urllib.parse.unquote_to_bytes(payload)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaError(f"{what}: the data: URL's base64 payload is invalid ({exc})") from exc


def _local_path(path: str, what: str, policy: MediaPolicy) -> str:
    if policy.allow_local is False:
        raise MediaError(
            f"{what}: local media paths are not allowed here (the server's --allowed-local-media-path "
            "names a directory they may come from)"
        )
    real = os.path.realpath(path)
    if isinstance(policy.allow_local, str):
        root = os.path.realpath(policy.allow_local)
        if os.path.commonpath([root, real]) != root:
            raise MediaError(f"{what}: {path!r} is outside the allowed media directory")
    if not os.path.isfile(real):
        raise MediaError(f"{what}: no such file: {path!r}")
    return real


class FetchedMedia(bytes):
    """Bytes a client's URL answered with: anything wrong with them is reported as a failed
    fetch (the uniform message), not in detail."""

    url: str

    def __new__(cls, data: bytes, url: str) -> FetchedMedia:
        fetched = super().__new__(cls, data)
        fetched.url = url
        return fetched


def _loggable(url: str) -> str:
    """The URL without credentials or query, shortened, for the server log."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        return f"{parts.scheme}://{host}{':' + str(parts.port) if parts.port else ''}{parts.path}"[:200]
    except ValueError:
        return repr(url[:80])


def fetch_failed(what: str, url: str, reason: str) -> MediaError:
    """The uniform client-facing error of a failed fetch; the reason is logged, not returned."""
    logger.warning("%s: media URL %s not fetched: %s", what, _loggable(url), reason)
    return MediaError(f"{what}: {FETCH_FAILED}")


@contextlib.contextmanager
def _uniform_if_fetched(data: Any, what: str) -> Iterator[None]:
    """Turn a MediaError about fetched bytes into the uniform failed-fetch error."""
    try:
        yield
    except MediaError as exc:
        if isinstance(data, FetchedMedia):
            raise fetch_failed(what, data.url, str(exc)) from None
        raise


def _check_fetch_allowed(what: str, policy: MediaPolicy) -> None:
    if not policy.allow_fetch:
        raise MediaError(f"{what}: fetching media from URLs is turned off; send the data inline (data: URL)")


def _fetch(url: str, what: str, policy: MediaPolicy) -> FetchedMedia:
    _check_fetch_allowed(what, policy)
    try:
        return FetchedMedia(fetch(url, policy.fetch), url)
    except FetchFailed as exc:
        raise fetch_failed(what, url, str(exc)) from None


async def fetch_media(url: str, what: str, policy: MediaPolicy) -> FetchedMedia:
    """The bytes of an `http(s)` media URL, fetched without blocking the caller's event loop;
    MediaError (the uniform message) when fetching is off, refused or fails."""
    _check_fetch_allowed(what, policy)
    try:
        return FetchedMedia(await fetch_async(url, policy.fetch), url)
    except FetchFailed as exc:
        raise fetch_failed(what, url, str(exc)) from None


def _scheme(url: str) -> str | None:
    """The URL's scheme in lower case (None: not even a URL's shape)."""
    try:
        return urllib.parse.urlsplit(url).scheme.lower()
    except ValueError:
        return None


def is_fetched_url(value: Any) -> bool:
    """Whether `value` is an `http(s)` URL, which `fetch_media` fetches."""
    return isinstance(value, str) and _scheme(value) in ("http", "https")


def resolve_url(url: str, what: str, policy: MediaPolicy) -> bytes | str:
    """The bytes of a `data:` / `http(s):` URL, or the checked path of a local file."""
    if not isinstance(url, str) or not url:
        raise MediaError(f"{what}: the url must be a non-empty string")
    scheme = _scheme(url)
    if scheme is None:
        raise fetch_failed(what, url, "malformed URL")
    if scheme == "data":
        data = _decode_data_url(url, what)
        if len(data) > policy.max_bytes:
            raise MediaError(f"{what}: the inline data is larger than {policy.max_bytes} bytes")
        return data
    if scheme in ("http", "https"):
        return _fetch(url, what, policy)
    if scheme == "file":
        return _local_path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path), what, policy)
    if scheme and len(scheme) > 1:  # a one-letter scheme is a Windows drive
        raise fetch_failed(what, url, f"unsupported URL scheme {scheme!r}")
    return _local_path(url, what, policy)


def _open_encoded(data: bytes | str, what: str, policy: MediaPolicy) -> Any:
    Image = require_pillow()
    try:
        with warnings.catch_warnings():  # oversized images are refused just below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data)
    except Image.DecompressionBombError as exc:
        raise MediaError(f"{what}: the image is too large (decompression bomb): {exc}") from exc
    except (OSError, ValueError, SyntaxError) as exc:
        raise MediaError(f"{what}: the data is not an image Pillow can decode ({exc})") from exc
    width, height = image.size
    if width * height > policy.max_image_pixels:
        raise MediaError(
            f"{what}: the image is {width}x{height} = {width * height} pixels, more than the "
            f"{policy.max_image_pixels} allowed (decompression bomb)"
        )
    try:
        image.load()
    except (OSError, ValueError, SyntaxError) as exc:
        raise MediaError(f"{what}: the image data is truncated or corrupt ({exc})") from exc
    return image


def _from_array(array: np.ndarray, what: str) -> Any:
    Image = require_pillow()
    if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
        array = np.moveaxis(array, 0, -1)  # channels first
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)):
        raise MediaError(f"{what}: an image array must be [H, W], [H, W, 3] or [H, W, 4]; got {array.shape}")
    if np.issubdtype(array.dtype, np.floating):
        if array.size and (np.nanmin(array) < 0.0 or np.nanmax(array) > 1.0):
            raise MediaError(f"{what}: a float image array must hold values in [0, 1]")
        array = np.round(array * 255).astype(np.uint8)
    elif array.dtype != np.uint8:
        raise MediaError(f"{what}: an image array must be uint8 or float in [0, 1]; got {array.dtype}")
    return Image.fromarray(np.ascontiguousarray(array))


def load_image(value: Any, what: str, policy: MediaPolicy) -> Any:
    """A PIL image from any accepted image form; MediaError naming `what` otherwise."""
    Image = require_pillow()
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        value = resolve_url(value, what, policy)
        if isinstance(value, str):  # a checked local path
            return _open_encoded(value, what, policy)
    if isinstance(value, (bytes, bytearray)):
        with _uniform_if_fetched(value, what):
            if len(value) > policy.max_bytes:
                raise MediaError(f"{what}: the image data is larger than {policy.max_bytes} bytes")
            return _open_encoded(bytes(value), what, policy)
    if isinstance(value, np.ndarray):
        return _from_array(value, what)
    raise MediaError(
        f"{what}: an image must be a PIL image, bytes, a path or URL, or a numpy array; got {type(value).__name__}"
    )


def load_video(value: Any, what: str, policy: MediaPolicy) -> tuple[DecodedVideo, dict[str, Any]]:
    """Frames of any accepted video form, and the per-video sampling options of a dict form."""
    options: dict[str, Any] = {}
    if isinstance(value, dict):
        if "video" not in value:
            raise MediaError(f"{what}: a video dict needs a 'video' entry (bytes, path or frames)")
        options = _sampling_options(value, what)
        value = value["video"]
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        value = resolve_url(value, what, policy)
        if isinstance(value, str):  # a checked local path
            return decode_video(value, what), options
    if isinstance(value, (bytes, bytearray)):
        with _uniform_if_fetched(value, what):
            if len(value) > policy.max_bytes:
                raise MediaError(f"{what}: the video data is larger than {policy.max_bytes} bytes")
            return decode_video(bytes(value), what), options
    if isinstance(value, np.ndarray) and value.ndim == 4:
        value = list(value)
    if isinstance(value, (list, tuple)) and value:
        frames = [np.asarray(to_rgb(load_image(f, f"{what} frame {i}", policy))) for i, f in enumerate(value)]
        if any(frame.shape != frames[0].shape for frame in frames):
            raise MediaError(f"{what}: all frames of a video must have the same size")
        return DecodedVideo(np.stack(frames), None), options
    raise MediaError(
        f"{what}: a video must be bytes, a path or URL, a list of frames, a [T, H, W, 3] array or a dict "
        f"with 'video'; got {type(value).__name__}"
    )


def _sampling_options(value: dict[str, Any], what: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key in ("fps", "min_frames", "max_frames"):
        if value.get(key) is not None:
            number = value[key]
            if isinstance(number, bool) or not isinstance(number, (int, float)) or number <= 0:
                raise MediaError(f"{what}: {key!r} must be a positive number, got {number!r}")
            fields[key] = number if key == "fps" else int(number)
    return fields
