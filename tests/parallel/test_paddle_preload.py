"""A cpu rank imports paddle without torch: paddle's tvm_ffi dependency would import torch where
it is installed (about half of `import paddle`), and the cpu backend never uses it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("paddle") is None or importlib.util.find_spec("torch") is None,
    reason="needs paddlepaddle and torch installed side by side (the test extra installs both)",
)

PROBE = """
import sys
{before}
from fastdeploy.parallel.paddle_communicator import PaddleCommunicator
PaddleCommunicator.preload()
print("paddle" in sys.modules, "torch" in sys.modules)
import torch
print(torch.ones(2).sum().item())
"""


def run_probe(before: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")


def test_preload_leaves_torch_unimported_and_importable():
    # a fresh process, as a rank is: paddle comes in, torch does not, and imports fine later
    assert run_probe("")[:2] == ["True False", "2.0"]


def test_preload_keeps_torch_where_the_backend_imported_it():
    assert run_probe("import torch")[:2] == ["True True", "2.0"]
