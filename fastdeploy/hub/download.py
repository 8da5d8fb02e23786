"""Downloads a hub model id from the hub `FD_MODEL_SOURCE` names and returns the local path the
model loads from: the snapshot folder of a safetensors checkpoint, or its GGUF file."""

from __future__ import annotations

import os

from fastdeploy import envs
from fastdeploy.errors import ModelNotFoundError
from fastdeploy.hub.files import choose_files, local_files
from fastdeploy.hub.huggingface import fetch_from_huggingface
from fastdeploy.hub.model_id import HubModelId
from fastdeploy.hub.sdk_hubs import fetch_from_aistudio, fetch_from_modelscope

_FETCHERS = {
    "HUGGINGFACE": fetch_from_huggingface,
    "MODELSCOPE": fetch_from_modelscope,
    "AISTUDIO": fetch_from_aistudio,
}


def download_model(model: HubModelId, revision: str | None = None, gguf_file: str | None = None) -> str:
    """Local path of `model` (at `revision`; `gguf_file` names one GGUF of the repository),
    downloaded first unless the hub's cache holds it."""
    folder, where = _FETCHERS[envs.model_source()](model, revision, gguf_file)
    selection = choose_files(local_files(folder), model, gguf_file, where)
    missing = [path for path in selection.files if not os.path.isfile(os.path.join(folder, path))]
    if missing:
        raise ModelNotFoundError(
            f"{where} ({folder}) lacks {', '.join(missing)}: the repository is incomplete at this revision"
        )
    return os.path.join(folder, selection.weights) if selection.weights else folder
