"""README's troubleshooting section quotes the messages users really get.

Each quoted message (placeholders such as NAME, DIR and `...` stand for any text) is matched
against the error the code raises in that situation, so a reworded error shows up here.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import socket
import subprocess
import sys

import pytest

from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.selection import create_backend
from fastdeploy.errors import FastDeployError
from fastdeploy.model_executor.loaders.safetensors_loader import safetensors_files
from fastdeploy.model_resolver import resolve_model
from fastdeploy.plugins.registry import first_that_can_load, get_registry

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def troubleshooting() -> str:
    with open(README, encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("\n## Troubleshooting\n", 1)[1].split("\n## ", 1)[0]
    return re.sub(r"\s*\n\s*", " ", section)  # quotes may wrap across lines


def quoted(start: str) -> str:
    """The message quoted in bold code (**`...`**) that begins with `start`."""
    messages = [m for m in re.findall(r"\*\*`(.*?)`\*\*", troubleshooting()) if m.startswith(start)]
    assert len(messages) == 1, f"README's troubleshooting section should quote one message starting {start!r}"
    return messages[0]


def as_pattern(message: str, placeholders: tuple[str, ...] = ()) -> str:
    pattern = re.escape(message).replace(re.escape("..."), ".*")
    for placeholder in placeholders:
        pattern = pattern.replace(re.escape(placeholder), ".+")
    return pattern


def raised(action) -> str:
    with pytest.raises(FastDeployError) as error:
        action()
    return str(error.value)


def test_embedded_model_not_installed(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    message = raised(lambda: resolve_model(None))
    assert re.match(as_pattern(quoted("model 'SmolLM2-135M-Instruct' ships")), message), message


def test_unknown_model_name():
    message = raised(lambda: resolve_model("no-such-model"))
    assert re.match(as_pattern(quoted("model 'NAME'"), ("NAME",)), message), message


def test_directory_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    message = raised(
        lambda: first_that_can_load(get_registry().weight_loaders(), str(tmp_path), "weight loader")
    )
    assert re.match(as_pattern(quoted("no registered weight loader"), ("DIR",)), message), message
    message = raised(lambda: safetensors_files(str(tmp_path)))
    assert re.match(as_pattern(quoted("DIR has no"), ("DIR",)), message), message


def test_device_that_cannot_run_here():
    if get_registry().device_backends()["cuda"].unavailable_reason() is None:
        pytest.skip("the cuda backend can run on this machine")
    message = raised(lambda: create_backend("cuda", BackendOptions(), get_registry()))
    assert re.match(as_pattern(quoted("the cuda backend")), message), message


def test_port_in_use():
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "fastdeploy", "serve", "--max-model-len", "256", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    assert done.returncode == 2
    expected = as_pattern(quoted("error: cannot listen on").replace("8080", str(port)))
    assert re.search(expected, done.stderr), done.stderr[-2000:]
