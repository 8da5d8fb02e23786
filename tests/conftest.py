"""Shared fixtures: the embedded SmolLM2 model, its transformers reference outputs, a shared LLM."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile

import pytest

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

# Keep the suite's logs out of the working tree; set before any fastdeploy logger exists.
os.environ["FD_LOG_DIR"] = tempfile.mkdtemp(prefix="fastdeploy-test-log-")
# Repacked GGUF weights go to a temporary directory that later runs reuse, not the user's cache.
os.environ.setdefault("FD_WEIGHT_CACHE", os.path.join(tempfile.gettempdir(), "fastdeploy-test-weight-cache"))
# ... bounded: every run's temporary GGUFs add entries that no later run reads (least recently used go).
os.environ.setdefault("FD_WEIGHT_CACHE_MAX_GB", "2")


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from fastdeploy.model_resolver import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def smollm2_reference() -> dict:
    """Greedy tokens and logits from transformers (tools/make_reference.py)."""
    with open(os.path.join(FIXTURES, "smollm2_reference.json"), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="session")
def llm():
    """One SmolLM2 engine for the tests that only generate (loading takes seconds)."""
    from fastdeploy import LLM

    return LLM(max_model_len=1024, max_num_seqs=32)


@pytest.fixture(scope="session")
def fault_plugin_dir(tmp_path_factory) -> str:
    """The test-only fault-injection plugin (tests/fault_injection) installed as a distribution in a
    directory of its own: put it on sys.path / PYTHONPATH to make its entry point visible."""
    path = os.path.join(os.path.dirname(__file__), "fault_injection", "distribution.py")
    spec = importlib.util.spec_from_file_location("fault_plugin_distribution", path)
    distribution = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(distribution)
    return distribution.install(str(tmp_path_factory.mktemp("fault-plugin")))
