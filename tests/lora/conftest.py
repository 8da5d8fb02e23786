"""A tiny Llama checkpoint, PEFT LoRA adapters made for it with the real `peft` package, and the
greedy tokens transformers + peft give for each (the independent reference)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# peft imports triton: set before it, as tests/backends/conftest.py does, so that Triton kernels
# defined later in the session run in the interpreter whichever directory is collected first
os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "entrypoints" / "openai"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import lora_fixtures  # noqa: E402
import tiny_checkpoints as tiny  # noqa: E402


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("llama")
    tiny.write_checkpoint(directory, "llama", "pt")
    tiny.write_ernie_tokenizer(directory)
    return str(directory)


@pytest.fixture(scope="session")
def adapters(llama_dir, tmp_path_factory) -> dict[str, str]:
    """name -> PEFT adapter directory, for each of `lora_fixtures.ADAPTERS`."""
    return {
        name: lora_fixtures.make_peft_adapter(llama_dir, str(tmp_path_factory.mktemp(name)), **spec)
        for name, spec in lora_fixtures.ADAPTERS.items()
    }


@pytest.fixture(scope="session")
def reference_tokens(llama_dir, adapters) -> dict[str | None, list[list[int]]]:
    """Adapter name (None: the base model) -> greedy tokens of each prompt, from transformers + peft."""
    return {
        name: lora_fixtures.peft_greedy(llama_dir, adapters.get(name), lora_fixtures.PROMPTS)
        for name in (None, *adapters)
    }
