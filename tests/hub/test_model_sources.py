"""FD_MODEL_SOURCE=MODELSCOPE / AISTUDIO: the SDK each calls, how, and the error when it is missing.

The SDKs are optional extras and are not installed here: a stub module in `sys.modules` records
the call and fills a folder as the SDK would; `None` there makes the import fail as a missing
package does.
"""

from __future__ import annotations

import os
import sys
import types

import pytest

from fastdeploy.backends.conformance.checkpoint import tiny_llama
from fastdeploy.errors import InvalidArgumentError, ModelDownloadError
from fastdeploy.model_resolver import resolve_model


def stub_sdk(monkeypatch, module: str, folder: str, files: dict[str, bytes] | None = None) -> list:
    """Put a module named `module` whose snapshot_download records its arguments and writes
    `files` (or a tiny checkpoint) into `folder`, which it returns."""
    calls = []

    def snapshot_download(*args, **kwargs):
        calls.append((args, kwargs))
        if files is None:
            tiny_llama(folder)
        else:
            for name, data in files.items():
                os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
                with open(os.path.join(folder, name), "wb") as handle:
                    handle.write(data)
        return folder

    monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(snapshot_download=snapshot_download))
    return calls


def test_modelscope_downloads_the_needed_patterns_with_fastdeploy_s_names(monkeypatch, tmp_path):
    monkeypatch.setenv("FD_MODEL_SOURCE", "modelscope")
    calls = stub_sdk(monkeypatch, "modelscope", str(tmp_path / "ms"))
    assert resolve_model("baidu/ERNIE-tiny") == str(tmp_path / "ms")
    ((args, kwargs),) = calls
    assert args == ("PaddlePaddle/ERNIE-tiny",)
    assert kwargs["revision"] == "master"
    assert {"config.json", "tokenizer.json", "*.safetensors"} <= set(kwargs["allow_patterns"])
    assert set(kwargs) == {"revision", "allow_patterns"}


def test_aistudio_picks_a_gguf_by_its_tag(monkeypatch, tmp_path):
    monkeypatch.setenv("FD_MODEL_SOURCE", "AISTUDIO")
    folder = str(tmp_path / "ai")
    calls = stub_sdk(monkeypatch, "aistudio_sdk.snapshot_download", folder, {"m-Q8_0.gguf": b"GGUF"})
    assert resolve_model("org/m-GGUF:q8_0", revision="v2") == os.path.join(folder, "m-Q8_0.gguf")
    ((args, kwargs),) = calls
    assert args == ()
    assert kwargs == {"repo_id": "org/m-GGUF", "revision": "v2", "allow_patterns": ["*[qQ]8_0*.gguf"]}


@pytest.mark.parametrize(
    ("source", "modules", "extra"),
    [
        ("MODELSCOPE", ("modelscope",), "modelscope"),
        ("AISTUDIO", ("aistudio_sdk", "aistudio_sdk.snapshot_download"), "aistudio"),
    ],
)
def test_a_missing_sdk_says_which_extra_to_install(monkeypatch, source, modules, extra):
    monkeypatch.setenv("FD_MODEL_SOURCE", source)
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # what a missing package imports as
    with pytest.raises(ModelDownloadError) as error:
        resolve_model("org/name")
    message = str(error.value)
    assert "\n" not in message
    assert f"FD_MODEL_SOURCE={source}" in message and f"pip install 'fastdeploy[{extra}]'" in message


def test_sdk_failures_are_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("FD_MODEL_SOURCE", "MODELSCOPE")

    def snapshot_download(*args, **kwargs):
        raise RuntimeError("The model: org/none not exists\nmore detail")

    monkeypatch.setitem(sys.modules, "modelscope", types.SimpleNamespace(snapshot_download=snapshot_download))
    with pytest.raises(ModelDownloadError, match=r"^ModelScope could not download org/none .*not exists;"):
        resolve_model("org/none")


def test_an_unknown_source_is_refused(monkeypatch):
    monkeypatch.setenv("FD_MODEL_SOURCE", "GITHUB")
    with pytest.raises(
        InvalidArgumentError, match="FD_MODEL_SOURCE must be one of HUGGINGFACE, MODELSCOPE, AISTUDIO"
    ):
        resolve_model("org/name")
