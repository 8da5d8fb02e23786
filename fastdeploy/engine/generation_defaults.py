"""Default sampling settings from a checkpoint's `generation_config.json`.

Model authors ship their recommended settings there (ERNIE-4.5: `top_p` 0.8, `temperature` 0.8).
FastDeploy applies `top_p`, `temperature` and the penalties to requests that leave them unset;
vLLM (its default `--generation-config auto`) also applies `top_k`, `min_p` and `max_new_tokens`
(as `max_tokens`). We apply that union, and only where the caller said nothing: offline when
`sampling_params` is None, in the server for each field a request omits. `generation_config="none"`
turns it off (vLLM's `--generation-config vllm`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: generation_config.json key -> SamplingParams field
_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "max_new_tokens": "max_tokens",
}


def read_generation_defaults(model_path: str, mode: str = "auto") -> dict[str, Any]:
    """SamplingParams keyword arguments from `model_path`'s generation_config.json ({} when the
    checkpoint has none, is a single file, or `mode` is "none"; `EngineConfig` has checked `mode`).
    An invalid value is an error naming the file, raised when the model loads, not per request."""
    path = os.path.join(model_path, "generation_config.json")
    if mode == "none" or not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{path} must hold a JSON object, got {type(data).__name__}")
    defaults = {field: data[key] for key, field in _FIELDS.items() if data.get(key) is not None}
    try:
        SamplingParams(**defaults)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"{path}: {exc} (pass generation_config='none' to ignore the file)"
        ) from exc
    if defaults:
        logger.info("default sampling settings from %s: %s", path, defaults)
    return defaults
