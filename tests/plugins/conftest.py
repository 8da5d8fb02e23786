"""The example plugin packages of plugins/, installed into the test environment.

`make setup` pip-installs them (editable); when the suite runs without it, this fixture installs
them once, the same way, so the tests always go through real entry points of real
distributions. Tests use the plugins only through fastdeploy (no `import fastdeploy_gpt2`).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE_PLUGINS = {
    "fastdeploy-gpt2": "plugins/fastdeploy-gpt2",
    "fastdeploy-minimal-model": "plugins/fastdeploy-minimal-model",
    "fastdeploy-think-parser": "plugins/fastdeploy-think-parser",
}


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="session")
def example_plugins() -> dict[str, str]:
    """Install the example plugins if missing; the registry is rebuilt to see them."""
    missing = [path for name, path in EXAMPLE_PLUGINS.items() if not _installed(name)]
    if missing:
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
        for path in missing:
            command += ["-e", os.path.join(ROOT, path)]
        subprocess.run(command, check=True, timeout=300)
        importlib.invalidate_caches()
        from fastdeploy.plugins.registry import reset_registry

        reset_registry()
    return EXAMPLE_PLUGINS


@pytest.fixture
def fresh_registry(monkeypatch):
    """Rebuild the process-wide registry from entry points for one test, and restore it after."""
    from fastdeploy.plugins import registry

    saved = registry._registry
    registry.reset_registry()
    yield registry
    registry._registry = saved
