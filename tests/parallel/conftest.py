"""Tiny checkpoints for the parallelism tests (tests/models/tiny_checkpoints.py), and their references."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import tiny_checkpoints as tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_references() -> dict:
    """Greedy tokens of the tiny models from transformers (tools/make_model_references.py)."""
    return json.loads((tiny.FIXTURES / "tiny_model_references.json").read_text(encoding="utf-8"))["models"]


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, str]:
    """Each tiny model as a -PT directory with an ERNIE-style tokenizer."""
    dirs = {}
    for name in ("llama", "qwen3", "ernie4_5", "ernie4_5_moe"):
        directory = tmp_path_factory.mktemp(name)
        tiny.write_checkpoint(directory, name, "pt")
        tiny.write_ernie_tokenizer(directory)
        dirs[name] = str(directory)
    return dirs
