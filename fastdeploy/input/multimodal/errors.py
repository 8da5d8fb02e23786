"""The error a malformed image or video raises: an `InvalidArgumentError` naming the part."""

from __future__ import annotations

import importlib

from fastdeploy.errors import InvalidArgumentError


class MediaError(InvalidArgumentError):
    """An image or video part could not be used; the message names the part and why.

    Offline it becomes the request's `error_code` 400 / `error_msg`; the server answers 400.
    """


def _optional(module: str, what: str, package: str) -> object:
    """`module` imported, or a MediaError saying how to install the `vision` extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MediaError(
            f"{what} need {package}, which is not installed: pip install 'fastdeploy[vision]' (or {package})"
        ) from exc


def require_pillow() -> object:
    """The PIL.Image module (images), or a MediaError saying how to install Pillow."""
    return _optional("PIL.Image", "images", "pillow")


def require_av() -> object:
    """The PyAV module (videos), or a MediaError saying how to install it."""
    return _optional("av", "videos", "av")
