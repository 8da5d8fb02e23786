"""Pieces of the one-line errors the hub clients' failures become."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (hub clients write several), or its type."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip().rstrip(".")
    return type(exc).__name__


def disk_full(model: object, target: str) -> str:
    """What to do when the disk filled up during a download into `target`."""
    return (
        f"no space left on the device while downloading {model} into {target}: free some space, or "
        "point the hub's cache at a larger disk (HF_HOME or HF_HUB_CACHE for Hugging Face), then run "
        "again to resume"
    )
