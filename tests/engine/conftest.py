"""The decoding tests build tiny models with tests/models/tiny_checkpoints.py; the fault tests load
the fault-injection plugin (tests/fault_injection)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from fastdeploy.plugins.registry import reset_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))


@pytest.fixture(scope="module")
def fault_env(fault_plugin_dir):
    """The fault plugin on sys.path (so its entry point is found), and a MonkeyPatch for its settings."""
    patch = pytest.MonkeyPatch()
    patch.syspath_prepend(fault_plugin_dir)
    importlib.invalidate_caches()
    reset_registry()
    yield patch
    patch.undo()
    reset_registry()
