"""ModelScope and AIStudio, through their own SDKs (the `modelscope` and `aistudio` extras).

Their repositories are not listed first: the SDK downloads the files matching the patterns the
model needs (`download_patterns`) into its own cache, and the weights are found in what arrived.
As in FastDeploy, their default revision is `master`, and ERNIE's `baidu/` repositories are
`PaddlePaddle/` there.
"""

from __future__ import annotations

import errno
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from fastdeploy.errors import ModelDownloadError
from fastdeploy.hub.files import download_patterns
from fastdeploy.hub.messages import disk_full, first_line
from fastdeploy.hub.model_id import HubModelId
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

DEFAULT_REVISION = "master"


def fetch_from_modelscope(model: HubModelId, revision: str | None, gguf_file: str | None) -> tuple[str, str]:
    """The folder ModelScope's `snapshot_download` fills with what `model` needs."""
    sdk = _import("modelscope", "MODELSCOPE", "modelscope", "modelscope")
    repo_id = paddle_repo_id(model.repo_id)
    return _download(
        sdk.snapshot_download,
        "ModelScope",
        model,
        repo_id,
        revision=revision or DEFAULT_REVISION,
        allow_patterns=download_patterns(model, gguf_file),
    )


def fetch_from_aistudio(model: HubModelId, revision: str | None, gguf_file: str | None) -> tuple[str, str]:
    """The folder AIStudio's `snapshot_download` (aistudio-sdk) fills with what `model` needs."""
    sdk = _import("aistudio_sdk.snapshot_download", "AISTUDIO", "aistudio-sdk", "aistudio")
    repo_id = paddle_repo_id(model.repo_id)
    return _download(
        sdk.snapshot_download,
        "AIStudio",
        model,
        repo_id=repo_id,
        revision=revision or DEFAULT_REVISION,
        allow_patterns=download_patterns(model, gguf_file),
    )


def paddle_repo_id(repo_id: str) -> str:
    """`baidu/NAME` -> `PaddlePaddle/NAME`: where ERNIE's repositories live on AIStudio and ModelScope."""
    owner, _, name = repo_id.partition("/")
    return f"PaddlePaddle/{name}" if owner.lower() == "baidu" else repo_id


def _import(module: str, source: str, package: str, extra: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ModelDownloadError(
            f"FD_MODEL_SOURCE={source} downloads through the {package} package, which cannot be imported "
            f"({first_line(exc)}): pip install 'fastdeploy[{extra}]'"
        ) from None


def _download(
    call: Callable[..., Any], hub: str, model: HubModelId, *args: Any, **kwargs: Any
) -> tuple[str, str]:
    logger.info("downloading %s from %s (%s)", model, hub, ", ".join(kwargs["allow_patterns"]))
    try:
        folder = call(*args, **kwargs)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise ModelDownloadError(disk_full(model, f"{hub}'s cache")) from None
        raise ModelDownloadError(_failed(hub, model, kwargs["revision"], exc)) from None
    except Exception as exc:  # the SDKs raise their own exception types
        raise ModelDownloadError(_failed(hub, model, kwargs["revision"], exc)) from None
    return str(folder), f"the downloaded copy of {model.repo_id} from {hub}"


def _failed(hub: str, model: HubModelId, revision: str, exc: Exception) -> str:
    return (
        f"{hub} could not download {model} (revision {revision!r}): {type(exc).__name__}: {first_line(exc)}; "
        "check the id and revision (FD_MODEL_SOURCE picks the hub), then run again"
    )
