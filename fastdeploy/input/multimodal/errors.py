"""The error a malformed image or video raises: an `InvalidArgumentError` naming the part."""

from __future__ import annotations

from fastdeploy.errors import InvalidArgumentError


class MediaError(InvalidArgumentError):
    """An image or video part could not be used; the message names the part and why.

    Offline it becomes the request's `error_code` 400 / `error_msg`; the server answers 400.
    """


def require_pillow() -> object:
    """The PIL.Image module, or a MediaError saying how to install it."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MediaError(
            "images need Pillow, which is not installed: pip install 'fastdeploy[vision]' (or pillow)"
        ) from exc
    return Image


def require_av() -> object:
    """The PyAV module, or a MediaError saying how to install it."""
    try:
        import av
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MediaError(
            "videos need PyAV, which is not installed: pip install 'fastdeploy[vision]' (or av)"
        ) from exc
    return av
